"""TokenTreeMDP: the abstraction of RL with verifiable rewards for a language model.

A "response" is a sequence of H tokens from a vocabulary of V; the state is the prefix, so the
MDP is a tree with V^d nodes at depth d and V^H leaves. A fixed set of leaves is correct; the
reward is 1 at a correct leaf and 0 elsewhere, given only at the end (gamma = 1).
A K-armed bandit is the special case H = 1.

Indexing: the node reached by tokens (a_0, ..., a_{d-1}) has id sum_i a_i V^(d-1-i) at depth d,
so the children of node n are n*V + a, and the leaves below a depth-d node form one contiguous
range of leaf ids. That makes exact values a sequence of reshapes.

A policy is a list of H tables ``probs[d]`` of shape (V^d, V): pi(a | node) at depth d.
``agentrl_lib.models.policies.TabularTreePolicy`` holds their logits as parameters.

Used by the ROVER notebook (He et al. 2025, "Random Policy Valuation is Enough for LLM Reasoning
with Verifiable Rewards", arXiv:2509.24981) and the policy-gradient notebook.
"""

from __future__ import annotations

import numpy as np
import torch

Tensor = torch.Tensor


def leaf_distribution(probs: list[Tensor]) -> Tensor:
    """P(leaf) (V^H,) of a per-depth policy: the product of pi along each root-to-leaf path."""
    p = torch.ones(1, dtype=probs[0].dtype)
    for probs_d in probs:
        p = (p[:, None] * probs_d).reshape(-1)  # (V^(d+1),)
    return p


class TokenTreeMDP:
    """V tokens, depth H, binary terminal reward on a set of correct leaves.

    correct: explicit leaf ids or token tuples; else ``num_correct`` leaves drawn with ``seed``.
    """

    def __init__(self, vocab_size: int = 4, depth: int = 6, num_correct: int = 8,
                 correct=None, seed: int = 0):
        if vocab_size < 2 or depth < 1:
            raise ValueError(f"need vocab_size >= 2 and depth >= 1, got {vocab_size}, {depth}")
        self.V, self.H = vocab_size, depth
        self.num_leaves = vocab_size**depth
        if self.num_leaves > 2**24:
            raise ValueError(f"V^H = {self.num_leaves} leaves is too many for exact tables")
        if correct is None:
            if not 1 <= num_correct <= self.num_leaves:
                raise ValueError(f"num_correct must be in [1, {self.num_leaves}], got {num_correct}")
            rng = np.random.default_rng(seed)
            ids = rng.choice(self.num_leaves, size=num_correct, replace=False)
        else:
            ids = [self.leaf_id(c) if isinstance(c, (tuple, list)) else int(c) for c in correct]
        self.correct_ids = torch.as_tensor(sorted(set(int(i) for i in ids)), dtype=torch.long)
        self.reward = torch.zeros(self.num_leaves, dtype=torch.float64)  # (V^H,)
        self.reward[self.correct_ids] = 1.0

    # --- indexing -------------------------------------------------------------------------------
    def leaf_id(self, tokens) -> int:
        if len(tokens) != self.H:
            raise ValueError(f"a leaf has {self.H} tokens, got {len(tokens)}")
        out = 0
        for a in tokens:
            out = out * self.V + int(a)
        return out

    def tokens(self, leaf_ids: Tensor) -> Tensor:
        """Leaf ids (B,) -> token sequences (B, H)."""
        powers = self.V ** torch.arange(self.H - 1, -1, -1)
        return (leaf_ids[:, None] // powers) % self.V

    def uniform_policy(self) -> list[Tensor]:
        return [torch.full((self.V**d, self.V), 1.0 / self.V, dtype=torch.float64)
                for d in range(self.H)]

    # --- exact values ---------------------------------------------------------------------------
    def values(self, probs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """Exact V^pi and Q^pi by backward recursion; differentiable in ``probs``.

        Returns (v, q): v[d] is (V^d,) for d = 0..H (v[H] is the leaf reward), q[d] is (V^d, V).
        """
        v = [None] * (self.H + 1)
        q = [None] * self.H
        v[self.H] = self.reward.to(probs[0].dtype)
        for d in range(self.H - 1, -1, -1):
            q[d] = v[d + 1].reshape(self.V**d, self.V)  # Q(node, a) = V(child); (V^d, V)
            v[d] = (probs[d] * q[d]).sum(-1)  # (V^d,)
        return v, q

    def expected_reward(self, probs: list[Tensor]) -> Tensor:
        """J(pi) = P(correct leaf) = pass@1, exactly."""
        return self.values(probs)[0][0][0]

    def uniform_q(self) -> list[Tensor]:
        """Q^unif[d] (V^d, V): the fraction of correct leaves below each child, which is the value
        of the uniform random policy from there (ROVER's central quantity)."""
        return [self.reward.reshape(self.V**d, self.V, -1).mean(-1) for d in range(self.H)]

    def optimal_q(self) -> list[Tensor]:
        """Q*[d] (V^d, V): 1 if a correct leaf lies below the child, else 0."""
        return [self.reward.reshape(self.V**d, self.V, -1).amax(-1) for d in range(self.H)]

    def leaf_distribution(self, probs: list[Tensor]) -> Tensor:
        """P(leaf) under the policy, (V^H,)."""
        return leaf_distribution(probs)

    def pass_at_k(self, probs: list[Tensor], k: int) -> Tensor:
        """Exact pass@k = 1 - (1 - J)^k for k independent samples."""
        return 1.0 - (1.0 - self.expected_reward(probs)) ** k

    def expected_distinct_correct(self, probs: list[Tensor], n: int) -> Tensor:
        """Expected number of distinct correct leaves among n samples: sum_l 1 - (1 - p_l)^n."""
        p = self.leaf_distribution(probs)[self.correct_ids]
        return (1.0 - (1.0 - p) ** n).sum()

    # --- sampling -------------------------------------------------------------------------------
    def sample(self, probs: list[Tensor], num: int, generator: torch.Generator | None = None):
        """Sample ``num`` leaves. Returns (tokens (B, H), node ids per depth (B, H), leaf ids (B,),
        rewards (B,)). node_ids[:, d] indexes probs[d]'s rows: the state at step d."""
        node = torch.zeros(num, dtype=torch.long)  # (B,)
        tokens = torch.empty(num, self.H, dtype=torch.long)
        nodes = torch.empty(num, self.H, dtype=torch.long)
        for d in range(self.H):
            nodes[:, d] = node
            a = torch.multinomial(probs[d][node].float(), 1, generator=generator).squeeze(-1)  # (B,)
            tokens[:, d] = a
            node = node * self.V + a
        return tokens, nodes, node, self.reward[node]
