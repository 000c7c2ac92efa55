"""Benchmark: KGSearchEnv's search tool (SQLite FTS5, BM25) on a 100k-document corpus, against a
linear scan of the same documents.

    .venv/bin/python reproductions/benchmarks/kg_search_index.py --entities 20000 --distractors 4

Builds the world (graph, corpus) once, then times, in one run:
- indexing: inserting every document into the FTS5 table (documents per second);
- querying: ``--queries`` searches for an entity's name (top 3), median and 95th percentile in ms;
- the baseline: the same queries by a linear scan that scores each document by the number of query
  words it contains (what a "loop over strings" search does), on the same corpus, timed on
  ``--scan-queries`` of them; both answer the same question, so the ratio is like for like;
- agreement: the share of scanned queries whose top-1 title the index also ranks in its top 3.
Printed ratios: scan / FTS5 per query (above 1: the index is faster).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agentrl_lib.envs.kg_search import SearchIndex, make_graph, render_corpus  # noqa: E402

WORD = re.compile(r"\w+")


def scan_search(docs_words, titles, query: str, k: int = 3):
    """Linear scan: score = number of distinct query words in the document (title counted 5x)."""
    q = set(WORD.findall(query.lower()))
    scored = []
    for i, (tw, bw) in enumerate(docs_words):
        s = 5 * len(q & tw) + len(q & bw)
        if s:
            scored.append((-s, i))
    scored.sort()
    return [(i, titles[i]) for _, i in scored[:k]]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entities", type=int, default=20000)
    ap.add_argument("--distractors", type=int, default=4)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--scan-queries", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    g = make_graph(args.entities, 4, args.seed)
    c = render_corpus(g, 1.0, args.distractors, args.seed)
    t_world = time.perf_counter() - t0
    t0 = time.perf_counter()
    idx = SearchIndex(c.titles, c.bodies)
    t_index = time.perf_counter() - t0
    n_docs = len(c.titles)

    queries = [g.names[(i * 7919) % args.entities] for i in range(args.queries)]
    lat = []
    for q in queries:
        t = time.perf_counter()
        idx.search(q, 3)
        lat.append(time.perf_counter() - t)
    lat_ms = sorted(1e3 * x for x in lat)

    docs_words = [(set(WORD.findall(t.lower())), set(WORD.findall(b.lower())))
                  for t, b in zip(c.titles, c.bodies)]
    scan_lat, agree = [], 0
    for q in queries[:args.scan_queries]:
        t = time.perf_counter()
        top = scan_search(docs_words, c.titles, q)
        scan_lat.append(time.perf_counter() - t)
        agree += bool(top) and top[0][1] in {tt for _, tt in idx.search(q, 3)}
    scan_ms = 1e3 * statistics.median(scan_lat)
    fts_ms = statistics.median(lat_ms)
    out = {"documents": n_docs, "world_s": t_world, "index_s": t_index,
           "docs_per_s": n_docs / t_index, "query_ms_median": fts_ms,
           "query_ms_p95": lat_ms[int(0.95 * (len(lat_ms) - 1))], "scan_ms_median": scan_ms,
           "scan_over_fts": scan_ms / fts_ms, "top1_agreement": agree / args.scan_queries}
    print(f"corpus: {n_docs} documents ({args.entities} entities x (1 + {args.distractors} "
          f"distractors)), built in {t_world:.2f} s")
    print(f"FTS5 index: {t_index:.2f} s ({out['docs_per_s']:.0f} documents/s)")
    print(f"FTS5 query (top 3, {args.queries} queries): median {fts_ms:.3f} ms, "
          f"p95 {out['query_ms_p95']:.3f} ms")
    print(f"linear scan ({args.scan_queries} queries): median {scan_ms:.1f} ms; "
          f"scan / FTS5 = {out['scan_over_fts']:.0f}x; the scan's top title is in FTS5's top 3 on "
          f"{out['top1_agreement']:.2f} of them")
    return out


if __name__ == "__main__":
    main()
