"""One file per algorithm family: config dataclass, pure loss, update step, training loop."""
