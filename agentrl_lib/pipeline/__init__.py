"""The papermill pipeline: notebook parameters and profiles, runs, results.json and the report."""
