"""POPE: privileged on-policy exploration with prefixes of oracle solutions, on a tree and on the LM.

Qu, Setlur, Smith, Salakhutdinov, Kumar 2026, "POPE: Learning to Reason on Hard Problems via
Privileged On-Policy Exploration", arXiv:2601.18779. On a *hard* problem the policy never samples a
correct answer, every group's rewards are all 0 and GRPO's advantage is 0: no signal. POPE puts a
prefix of an oracle (human) solution in front of the policy's own continuation; the guided rollouts
sometimes succeed, the update trains only on the policy's tokens (the prefix is context, never a
target), and training mixes guided and unguided prompts. The paper's controls (entropy bonus,
clip-higher, mixing in easy problems) do not solve more hard problems; mixing easy problems slows
the hard ones ("ray interference", Schaul et al. 2019).

Two rungs, one configuration (``POPEConfig``) of which prompts are guided and by how much:

- **the tree** (``HabitTreeProblems``, ``HabitTreePolicy``, ``train_tree``): each problem is a
  ``TokenTreeMDP`` (V tokens, depth H) with one correct leaf, its oracle solution. The policy's
  logits at a node are a shared per-depth "habit" w[d] (V,) plus a per-problem, per-node table
  u[p, d] (V^d, V): the habit stands for what SFT taught (easy problems follow it: their oracle
  leaves off it at one depth; hard ones leave it at every depth, so their initial success is about
  p_off^H, ~1e-11). A guided rollout forces the first k oracle tokens and samples the rest; the
  loss masks the forced tokens out. Exact unguided success per problem (``unguided_success``) is
  the metric. In a table the transfer from guided to unguided is exact state sharing: the node
  after the prefix is the node the unguided policy reaches when it picks those tokens itself.
- **the LM** (``guided_sampler``): a ``grpo.Batch`` sampler for ``grpo.train`` whose guided prompts
  carry the first k lines of ``text_tasks.reference_completion`` in the user turn, followed by an
  instruction to continue that partial solution (``GUIDANCE_INSTRUCTION``; the paper's guided
  prompt is the problem, the oracle prefix and a system instruction to build on it; its wording is
  not retrievable here), so they sit in ``prompt_ids`` and the loss (over ``completion_ids``) never
  sees them. ``prompt_form='prefill'`` (a variant: the lines after the assistant tag, no
  instruction) is the form this module used before issue 27.

The prefix (``schedule='minimal'``, the paper's): per hard problem, before RL, the start policy is
tried on progressively longer oracle prefixes, k = 1, 2, ... up to ``prefix_cap`` (a quarter) of
the solution, and the shortest k at which any of ``probe_samples`` guided rollouts succeeds is kept
for the whole run (``minimal_prefix``, ``tree_minimal_prefixes``, ``lm_minimal_prefixes``: the
shortest prefix at which the base model samples at least one correct completion). A problem
with no such prefix within the cap is left unguided (inferred). ``schedule='anneal'`` (a variant,
this module's form before issue 27): a fraction of the solution that shrinks linearly over
training (``prefix_start`` -> ``prefix_end`` over ``anneal_frac``). Inferred (the paper does not
fix it for a toy): a fixed share ``guided_frac`` of the hard prompts of a round is guided (the
paper mixes guided and unguided copies 1:1). Two named variants of the catalog are cells here:
``guidance='guide'`` (Guide, Nath et al. 2025,
"Adaptive Guidance Accelerates RL of Reasoning Models", arXiv:2506.13923: guidance only for a
problem whose last unguided group all failed; its importance correction to the hint-free context is
the identity in the tree, where the policy's tokens after the prefix are scored by the same table
with or without it, and is left out on the LM rung), and ``guidance='snapshot'`` (SnapshotRL, Zhao
et al. 2024, arXiv:2403.00673: student episodes start from states of teacher trajectories; here
every hard group starts from the oracle state at a depth drawn uniformly from 0..H-1, through all
of training, with no unguided share; its S3RL baseline's early-phase-only use of snapshots, status
classification and trajectory truncation are not implemented).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from agentrl_lib import core
from agentrl_lib.algorithms import loop
from agentrl_lib.algorithms.grpo import Batch, GRPOConfig, sampler_generators, score
from agentrl_lib.envs.text_tasks import reference_completion
from agentrl_lib.rollout import format_prompts, generate
from agentrl_lib.utils import optimizer_step

Tensor = torch.Tensor
GUIDANCE = ("none", "pope", "guide", "snapshot")
SCHEDULES = ("minimal", "anneal")
PROMPT_FORMS = ("instruction", "prefill")
GUIDANCE_INSTRUCTION = "continue this partial solution and give the answer"
"""The LM rung's instruction after the oracle lines (our wording; the paper's is not retrievable
here: its default instruction lets the model restate or question the guidance)."""


@dataclass
class POPEConfig:
    guidance: str = "pope"
    """which hard prompts get an oracle prefix: 'none' (plain on-policy RL), 'pope' (a share
    ``guided_frac`` of each round's hard prompts, prefix length on the shrinking schedule),
    'guide' (a hard problem is guided when its last unguided group had reward 0 everywhere),
    'snapshot' (every hard group starts at a uniformly drawn oracle depth; tree only)"""
    guided_frac: float = 0.5
    """'pope': the share of a round's hard prompts shown with a prefix (the rest unguided)"""
    schedule: str = "minimal"
    """'pope': 'minimal' (the paper: each problem's shortest sufficient prefix, found before RL
    and fixed) or 'anneal' (a variant: the shrinking fraction ``prefix_start`` -> ``prefix_end``)"""
    prefix_cap: float = 0.25
    """'minimal': the longest prefix tried, as a fraction of the solution (the paper: a quarter)"""
    probe_samples: int = 128
    """'minimal': guided rollouts of the start policy per (problem, k) in the search (inferred:
    the paper's hard problems failed 128 attempts)"""
    prompt_form: str = "instruction"
    """LM: 'instruction' (the oracle lines in the user turn, then ``GUIDANCE_INSTRUCTION``) or
    'prefill' (a variant: the lines after the assistant tag)"""
    prefix_start: float = 1.0
    """prefix length as a fraction of the oracle solution at the first round (``prefix_len``
    caps it at all steps but one, so 1.0 gives each length from n - 1 down the same share of the
    annealing)"""
    prefix_end: float = 0.0
    """... and from ``anneal_frac`` of training on (linear in between)"""
    anneal_frac: float = 0.8
    """the share of the rounds over which the prefix shrinks"""
    easy_frac: float = 0.0
    """the share of each round's prompts drawn from the easy problems (0: hard only)"""

    def __post_init__(self):
        if self.guidance not in GUIDANCE:
            raise ValueError(f"unknown guidance {self.guidance!r}; choose one of {GUIDANCE}")
        for name in ("guided_frac", "prefix_start", "prefix_end", "easy_frac"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose one of {SCHEDULES}")
        if self.prompt_form not in PROMPT_FORMS:
            raise ValueError(f"unknown prompt_form {self.prompt_form!r}; choose one of "
                             f"{PROMPT_FORMS}")
        if not 0.0 <= self.prefix_cap <= 1.0 or self.probe_samples < 1:
            raise ValueError("prefix_cap must be in [0, 1] and probe_samples >= 1")
        if not 0.0 < self.anneal_frac <= 1.0:
            raise ValueError(f"anneal_frac must be in (0, 1], got {self.anneal_frac!r}")


# --- pure pieces -----------------------------------------------------------------------------------
def prefix_fraction(it: int, num_iters: int, cfg: POPEConfig) -> float:
    """The shrinking schedule: ``prefix_start`` at round 0, linear to ``prefix_end`` at round
    ``anneal_frac * num_iters``, then constant.

    >>> c = POPEConfig(prefix_start=0.8, prefix_end=0.0, anneal_frac=0.5)
    >>> [round(prefix_fraction(i, 10, c), 2) for i in (0, 2, 5, 9)]
    [0.8, 0.48, 0.0, 0.0]
    """
    t = min(it / max(cfg.anneal_frac * num_iters, 1e-9), 1.0)
    return cfg.prefix_start + t * (cfg.prefix_end - cfg.prefix_start)


def prefix_len(frac: float, n: int) -> int:
    """How many of an oracle solution's ``n`` steps a prefix of fraction ``frac`` holds: floor,
    and never the whole solution (at most n - 1), so the policy always has a step to take.

    >>> [prefix_len(f, 8) for f in (0.0, 0.3, 0.875, 1.0)]
    [0, 2, 7, 7]
    """
    return min(int(np.floor(frac * n + 1e-9)), n - 1)


def minimal_prefix(solves, n: int, cap: float) -> int:
    """The paper's prefix for one problem of ``n`` oracle steps: the smallest k in
    1..``prefix_len(cap, n)`` for which ``solves(k)`` (the start policy, guided by k oracle steps,
    succeeds at least once) is true, trying k in increasing order and stopping at the first; 0
    (left unguided) when none is.

    >>> minimal_prefix(lambda k: k >= 2, 8, 0.25), minimal_prefix(lambda k: k >= 3, 8, 0.25)
    (2, 0)
    """
    for k in range(1, prefix_len(cap, n) + 1):
        if solves(k):
            return k
    return 0


def split_round(num_prompts: int, cfg: POPEConfig) -> tuple[int, int]:
    """(easy prompts, hard prompts) of a round: round(easy_frac * num_prompts) easy.

    >>> split_round(8, POPEConfig(easy_frac=0.5)), split_round(8, POPEConfig())
    ((4, 4), (0, 8))
    """
    n_easy = int(round(cfg.easy_frac * num_prompts))
    return n_easy, num_prompts - n_easy


def guided_lengths(hard_ids: list[int], n_steps: list[int], it: int, num_iters: int,
                   cfg: POPEConfig, unsolved: set, rng: random.Random,
                   prefixes: dict | None = None) -> list[int]:
    """The prefix length (in oracle steps) of each hard prompt of round ``it``; 0 is unguided.

    'none': all 0. 'pope': the first round(guided_frac * n) prompts get their problem's fixed
    minimal prefix ``prefixes[id]`` (schedule 'minimal'; 0 where none was found) or
    ``prefix_len`` of the shrinking fraction (schedule 'anneal'), the rest 0. 'guide': the
    shrinking fraction's length for the problems in ``unsolved`` (their last unguided group had no
    success), else 0. 'snapshot': a length drawn uniformly from 0..n_steps-1.
    """
    frac = prefix_fraction(it, num_iters, cfg)
    if cfg.guidance == "none":
        return [0] * len(hard_ids)
    if cfg.guidance == "pope":
        n_guided = int(round(cfg.guided_frac * len(hard_ids)))
        if cfg.schedule == "minimal":
            if prefixes is None:
                raise ValueError("schedule 'minimal' needs each hard problem's prefix (prefixes)")
            return [prefixes.get(p, 0) if i < n_guided else 0 for i, p in enumerate(hard_ids)]
        return [prefix_len(frac, n) if i < n_guided else 0 for i, n in enumerate(n_steps)]
    if cfg.guidance == "guide":
        return [prefix_len(frac, n) if p in unsolved else 0 for p, n in zip(hard_ids, n_steps)]
    return [rng.randrange(n) for n in n_steps]  # snapshot


# --- the tree rung ---------------------------------------------------------------------------------
class HabitTreeProblems:
    """``num_hard`` + ``num_easy`` problems on one tree shape (V tokens, depth H), each with one
    correct leaf (its oracle solution). Token 0 is the habit; a hard oracle takes a non-habit token
    at every depth, an easy one at exactly one depth (both drawn with ``seed``). Problems 0..num_hard-1
    are the hard ones."""

    def __init__(self, vocab_size: int = 4, depth: int = 8, num_hard: int = 16, num_easy: int = 16,
                 seed: int = 0):
        from agentrl_lib.envs.token_tree import TokenTreeMDP
        self.V, self.H, self.num_hard, self.num_easy = vocab_size, depth, num_hard, num_easy
        rng = np.random.default_rng(seed)
        oracles = [rng.integers(1, vocab_size, size=depth) for _ in range(num_hard)]
        for _ in range(num_easy):
            o = np.zeros(depth, dtype=np.int64)
            o[rng.integers(depth)] = rng.integers(1, vocab_size)
            oracles.append(o)
        self.oracle = torch.as_tensor(np.stack(oracles), dtype=torch.long)  # (P, H)
        self.trees = [TokenTreeMDP(vocab_size, depth, correct=[tuple(o.tolist())])
                      for o in self.oracle]
        self.correct = torch.tensor([int(t.correct_ids[0]) for t in self.trees])  # (P,)

    @property
    def num_problems(self) -> int:
        return self.num_hard + self.num_easy


class HabitTreePolicy(torch.nn.Module):
    """logits(p, d, node) = w[d] + u[d][p, node]: a shared per-depth habit (H, V), initialised to
    log(p_habit) on token 0 and log((1 - p_habit)/(V - 1)) elsewhere, plus per-problem tables
    u[d] (P, V^d, V) at zero."""

    def __init__(self, num_problems: int, vocab_size: int, depth: int, p_habit: float = 0.85):
        super().__init__()
        self.P, self.V, self.H = num_problems, vocab_size, depth
        w0 = torch.full((depth, vocab_size), np.log((1 - p_habit) / (vocab_size - 1)),
                        dtype=torch.float64)
        w0[:, 0] = np.log(p_habit)
        self.w = torch.nn.Parameter(w0)  # (H, V)
        self.u = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(num_problems, vocab_size**d, vocab_size,
                                            dtype=torch.float64)) for d in range(depth)])

    def logits_at(self, d: int, problems: Tensor, nodes: Tensor) -> Tensor:
        """(B,) problems and depth-d node ids -> (B, V) logits."""
        return self.w[d] + self.u[d][problems, nodes]

    def probs(self) -> list[Tensor]:
        """pi per depth for every problem: H x (P, V^d, V)."""
        return [torch.softmax(self.w[d] + self.u[d], -1) for d in range(self.H)]


@torch.no_grad()
def unguided_success(policy: HabitTreePolicy, problems: HabitTreeProblems) -> Tensor:
    """Exact P(correct leaf | problem) (P,) of the unguided policy from the root: the product of
    pi along the oracle path, summed over the one correct leaf (``token_tree.leaf_distribution`` per
    problem, read at its correct leaf)."""
    probs = policy.probs()
    idx = torch.arange(problems.num_problems)
    node = torch.zeros(problems.num_problems, dtype=torch.long)
    p = torch.ones(problems.num_problems, dtype=torch.float64)
    for d in range(problems.H):  # only the oracle path carries the correct leaf's mass
        a = problems.oracle[:, d]
        p = p * probs[d][idx, node, a]
        node = node * problems.V + a
    return p


def sample_guided(policy: HabitTreePolicy, problems: HabitTreeProblems, prob_ids: Tensor,
                  k: Tensor, generator: torch.Generator | None = None):
    """Rollouts of problems ``prob_ids`` (B,) whose first ``k`` (B,) tokens are the oracle's.
    Returns (nodes (B, H), tokens (B, H), loss_mask (B, H): 1 on the policy's own tokens,
    old_logps (B, H), rewards (B,))."""
    B, H = prob_ids.shape[0], problems.H
    node = torch.zeros(B, dtype=torch.long)
    nodes = torch.empty(B, H, dtype=torch.long)
    tokens = torch.empty(B, H, dtype=torch.long)
    with torch.no_grad():
        for d in range(H):
            nodes[:, d] = node
            pi = torch.softmax(policy.logits_at(d, prob_ids, node), -1)  # (B, V)
            a = torch.multinomial(pi, 1, generator=generator).squeeze(-1)  # (B,)
            a = torch.where(d < k, problems.oracle[prob_ids, d], a)
            tokens[:, d] = a
            node = node * problems.V + a
        loss_mask = (torch.arange(H)[None, :] >= k[:, None]).float()  # (B, H)
        old_logps = tree_logps(policy, prob_ids, nodes, tokens)[0]
    rewards = (node == problems.correct[prob_ids]).double()  # (B,)
    return nodes, tokens, loss_mask, old_logps, rewards


def tree_minimal_prefixes(policy: HabitTreePolicy, problems: HabitTreeProblems, ids: list[int],
                          cfg: POPEConfig, generator: torch.Generator | None = None) -> dict:
    """The paper's prefix search on the tree, before RL: {problem: k} with k from
    ``minimal_prefix`` over ``cfg.probe_samples`` guided rollouts of ``policy`` (the start) per
    tried k (``sample_guided``); 0 where no k up to ``cfg.prefix_cap`` of H succeeded."""
    n = cfg.probe_samples

    def solves(p: int, k: int) -> bool:
        r = sample_guided(policy, problems, torch.full((n,), p), torch.full((n,), k), generator)[4]
        return bool(r.sum() > 0)

    return {p: minimal_prefix(lambda k: solves(p, k), problems.H, cfg.prefix_cap) for p in ids}


def tree_logps(policy: HabitTreePolicy, prob_ids: Tensor, nodes: Tensor, tokens: Tensor):
    """log pi(a_d | node_d) and the entropy of pi(. | node_d), each (B, H)."""
    lp, ent = [], []
    for d in range(policy.H):
        logp = torch.log_softmax(policy.logits_at(d, prob_ids, nodes[:, d]), -1)  # (B, V)
        lp.append(logp.gather(-1, tokens[:, d:d + 1]))
        ent.append(-(logp.exp() * logp).sum(-1, keepdim=True))
    return torch.cat(lp, -1), torch.cat(ent, -1)


def tree_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, loss_mask: Tensor,
              entropies: Tensor, cfg: GRPOConfig) -> tuple[Tensor, dict]:
    """GRPO's clipped loss on the policy's tokens only (the forced prefix is masked out), mean over
    each rollout's tokens then over rollouts ('seq_mean'), minus ``entropy_coef`` x the masked mean
    entropy. logps, old_logps, loss_mask, entropies: (B, H); advantages: (B,)."""
    per_tok = core.clipped_token_loss(logps, old_logps, advantages, cfg.clip_eps,
                                      cfg.clip_eps_high, loss_mask)  # (B, H)
    pg = core.aggregate(per_tok, loss_mask, cfg.loss_agg)
    ent = core.masked_mean(entropies, loss_mask)
    loss = pg - cfg.entropy_coef * ent
    return loss, {"policy_loss": pg.item(), "entropy": ent.item(),
                  **core.clip_stats(logps, old_logps, advantages, loss_mask, cfg.clip_eps,
                                    cfg.clip_eps_high)}


def train_tree(problems: HabitTreeProblems, cfg: GRPOConfig, pcfg: POPEConfig,
               p_habit: float = 0.85, eval_every: int = 10,
               prefixes: dict | None = None) -> tuple[HabitTreePolicy, list[dict]]:
    """GRPO on the tree problems with ``pcfg``'s guidance: each of ``cfg.num_iters`` rounds draws
    ``split_round`` easy and hard problems (seeded by ``cfg.seed``), ``cfg.group_size`` rollouts
    each, prefix lengths by ``guided_lengths`` (POPE's 'minimal' schedule: ``prefixes``, or when
    None ``tree_minimal_prefixes`` of the start policy with its own generator seeded
    ``cfg.seed + 1``, so the rounds draw as every other arm's), group advantages
    (``cfg.estimator``),
    ``cfg.num_epochs`` Adam steps of ``tree_loss`` at ``cfg.lr``. Rows: ``iter``, ``samples``,
    ``rollout/*`` (reward on hard prompts, guided share), ``losses/*``, and every ``eval_every``
    rounds ``eval/hard_success`` (mean exact unguided success of the hard problems),
    ``eval/hard_solved`` (share with success >= 0.5), ``eval/easy_success``, ``eval/log10_hard``."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    policy = HabitTreePolicy(problems.num_problems, problems.V, problems.H, p_habit)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    n_easy, n_hard = split_round(cfg.num_prompts, pcfg)
    per_round = cfg.num_prompts * cfg.group_size
    unsolved: set = set()
    if pcfg.guidance == "pope" and pcfg.schedule == "minimal" and prefixes is None:
        prefixes = tree_minimal_prefixes(policy, problems, list(range(problems.num_hard)), pcfg,
                                         torch.Generator().manual_seed(cfg.seed + 1))

    def evaluate(policy) -> dict:
        s = unguided_success(policy, problems)
        hard, easy = s[:problems.num_hard], s[problems.num_hard:]
        return {"hard_success": hard.mean().item(),
                "hard_solved": (hard >= 0.5).double().mean().item(),
                "log10_hard": hard.clamp(min=1e-300).log10().mean().item(),
                "easy_success": easy.mean().item() if len(easy) else float("nan")}

    def sample(policy, it: int) -> SimpleNamespace:
        hard_ids = rng.sample(range(problems.num_hard), n_hard)
        easy_ids = rng.sample(range(problems.num_hard, problems.num_problems), n_easy)
        ks = guided_lengths(hard_ids, [problems.H] * n_hard, it, cfg.num_iters, pcfg, unsolved,
                            rng, prefixes)
        prob_ids = torch.tensor(hard_ids + easy_ids).repeat_interleave(cfg.group_size)  # (B*G,)
        k = torch.tensor(ks + [0] * n_easy).repeat_interleave(cfg.group_size)  # (B*G,)
        nodes, tokens, mask, old_logps, rewards = sample_guided(policy, problems, prob_ids, k, gen)
        r = rewards.view(-1, cfg.group_size)  # (num_prompts, G)
        for j, p in enumerate(hard_ids):  # Guide's memory: which hard problems failed unguided
            if ks[j] == 0:
                (unsolved.add if r[j].sum() == 0 else unsolved.discard)(p)
        guided = torch.tensor([kk > 0 for kk in ks], dtype=torch.float64)
        metrics = {"samples": (it + 1) * per_round,
                   "rollout/hard_reward": r[:n_hard].mean().item(),
                   "rollout/hard_unguided_reward": (r[:n_hard][guided == 0].mean().item()
                                                    if (guided == 0).any() else float("nan")),
                   "rollout/guided_frac": guided.mean().item() if n_hard else 0.0,
                   "rollout/prefix_frac": (prefix_fraction(it, cfg.num_iters, pcfg)
                                           if pcfg.schedule == "anneal" or pcfg.guidance != "pope"
                                           else float(np.mean(ks)) / problems.H if ks else 0.0)}
        return SimpleNamespace(metrics=metrics, prob_ids=prob_ids, nodes=nodes, tokens=tokens,
                               mask=mask, old_logps=old_logps, r=r)

    def update(b: SimpleNamespace, it: int) -> dict:
        adv = core.group_advantages(b.r, cfg.estimator, ddof=cfg.std_ddof).reshape(-1)  # (B*G,)
        for _ in range(cfg.num_epochs):
            logps, ents = tree_logps(policy, b.prob_ids, b.nodes, b.tokens)
            loss, m = tree_loss(logps, b.old_logps, adv, b.mask, ents, cfg)
            optimizer_step(opt, loss)
        return {f"losses/{a}": v for a, v in m.items()}

    rows = loop.run(policy, sample, update, cfg.num_iters, evaluate=evaluate,
                    eval_every=eval_every, start={"samples": 0}, desc="pope")
    return policy, rows


# --- the LM rung -----------------------------------------------------------------------------------
def guided_prompt(prompt_text: str, problem: dict, k: int) -> str:
    """The 'prefill' form (a variant): the rendered chat prompt followed by the first ``k`` lines
    of the oracle solution (each ending in a newline), after the assistant tag; the model continues
    from there, the prefix is prompt-side.

    >>> p = {"task": "chain", "steps": ["+4", "*2"], "values": [3, 7, 14]}
    >>> guided_prompt("Q:", p, 1)
    'Q:3+4=7\\n'
    """
    lines = reference_completion(problem).split("\n")
    return prompt_text + "".join(line + "\n" for line in lines[:k])


def instructed_problem(problem: dict, k: int) -> dict:
    """The 'instruction' form (the paper's): the problem whose user turn is its prompt, the first
    ``k`` lines of the oracle solution and ``GUIDANCE_INSTRUCTION``; ``k`` = 0 is the problem as
    it is. The model's whole answer is its own (it may restate the given lines).

    >>> p = {"prompt": "3 +4 *2 =", "task": "chain", "steps": ["+4", "*2"], "values": [3, 7, 14]}
    >>> instructed_problem(p, 1)["prompt"]
    '3 +4 *2 =\\n3+4=7\\ncontinue this partial solution and give the answer'
    """
    if k == 0:
        return problem
    lines = reference_completion(problem).split("\n")[:k]
    return {**problem, "prompt": "\n".join([problem["prompt"], *lines, GUIDANCE_INSTRUCTION])}


def guided_prompts(tokenizer, problems: list[dict], ks: list[int], form: str = "instruction"
                   ) -> list[str]:
    """Each problem's prompt text guided by its ``k`` oracle lines in ``form`` ('instruction' or
    'prefill'); k = 0 gives ``format_prompts``' unguided prompt in both."""
    if form == "prefill":
        return [guided_prompt(h, p, k)
                for h, p, k in zip(format_prompts(tokenizer, problems), problems, ks)]
    return format_prompts(tokenizer, [instructed_problem(p, k) for p, k in zip(problems, ks)])


@torch.no_grad()
def lm_minimal_prefixes(model, tokenizer, problems: list[dict], reward_funcs: list,
                        pcfg: POPEConfig, max_new_tokens: int, temperature: float = 1.0,
                        generator: torch.Generator | None = None) -> list[int]:
    """The paper's prefix search on the LM, before RL: for k = 1, 2, ... up to ``pcfg.prefix_cap``
    of each chain's steps, ``pcfg.probe_samples`` completions of the still-unresolved problems
    guided by k lines (``pcfg.prompt_form``); a problem's k is the first at which any completion
    is rewarded (``minimal_prefix``, batched over problems), 0 where none was."""
    out = [0] * len(problems)
    todo = list(range(len(problems)))
    n = pcfg.probe_samples
    for k in range(1, max(prefix_len(pcfg.prefix_cap, len(p["steps"])) for p in problems) + 1):
        todo = [i for i in todo if k <= prefix_len(pcfg.prefix_cap, len(problems[i]["steps"]))]
        if not todo:
            break
        batch = [problems[i] for i in todo]
        prompts = [q for q in guided_prompts(tokenizer, batch, [k] * len(batch), pcfg.prompt_form)
                   for _ in range(n)]
        model.eval()
        gen = generate(model, tokenizer, prompts, max_new_tokens, temperature=temperature,
                       generator=generator)
        r = score(reward_funcs, gen.texts, [p for p in batch for _ in range(n)]).view(-1, n)
        solved = set()
        for j, i in enumerate(todo):
            if r[j].sum() > 0:
                out[i] = k
                solved.add(i)
        todo = [i for i in todo if i not in solved]
    return out


def guided_sampler(tokenizer, hard_problems: list[dict], easy_problems: list[dict],
                   reward_funcs: list, cfg: GRPOConfig, pcfg: POPEConfig,
                   prefixes: list[int] | None = None):
    """``sample(model, it=0) -> grpo.Batch`` for ``grpo.train``: each round draws ``split_round``
    easy and hard problems (seeded by ``cfg.seed``), guides the hard ones by ``guided_lengths`` (k
    lines of the reference solution, k counted in the chain's steps; POPE's 'minimal' schedule
    reads ``prefixes[i]`` of hard problem i, from ``lm_minimal_prefixes``) in
    ``pcfg.prompt_form``, samples ``cfg.group_size`` completions of each and scores them with
    ``reward_funcs`` on the completion (the model's own tokens). ``rollout/reward`` is over every
    row; ``rollout/hard_reward``,
    ``rollout/hard_unguided_reward`` and ``rollout/guided_frac`` are over the hard prompts."""
    _, tokens = sampler_generators(hard_problems, cfg, "hard problems")
    rng = random.Random(cfg.seed)
    n_easy, n_hard = split_round(cfg.num_prompts, pcfg)
    if n_easy > len(easy_problems):
        raise ValueError(f"{n_easy} easy prompts a round but {len(easy_problems)} easy problems")
    unsolved: set = set()
    by_id = None if prefixes is None else dict(enumerate(prefixes))

    def sample(model, it: int = 0) -> Batch:
        t0 = time.time()
        hard_ids = rng.sample(range(len(hard_problems)), n_hard)
        easy = rng.sample(easy_problems, n_easy)
        hard = [hard_problems[i] for i in hard_ids]
        ks = guided_lengths(hard_ids, [len(p["steps"]) for p in hard], it, cfg.num_iters, pcfg,
                            unsolved, rng, by_id)
        batch = hard + easy
        kk = ks + [0] * n_easy
        problems = [p for p in batch for _ in range(cfg.group_size)]  # (B*G) prompt-major
        prompts = [q for q in guided_prompts(tokenizer, batch, kk, pcfg.prompt_form)
                   for _ in range(cfg.group_size)]
        model.eval()
        gen = generate(model, tokenizer, prompts, cfg.max_new_tokens, temperature=cfg.temperature,
                       generator=tokens(model))
        t_gen = time.time() - t0
        rewards = score(reward_funcs, gen.texts, problems).to(gen.logps.device)  # (B*G,)
        r = rewards.view(-1, cfg.group_size).cpu()  # (num_prompts, G)
        for j, i in enumerate(hard_ids):
            if ks[j] == 0:
                (unsolved.add if r[j].sum() == 0 else unsolved.discard)(i)
        unguided = [j for j in range(n_hard) if ks[j] == 0]
        return Batch(gen, rewards, {
            "rollout/reward": rewards.mean().item(),
            "rollout/hard_reward": r[:n_hard].mean().item(),
            "rollout/hard_unguided_reward": r[unguided].mean().item() if unguided else float("nan"),
            "rollout/guided_frac": float(np.mean([k > 0 for k in ks])) if n_hard else 0.0,
            "rollout/completion_len": gen.completion_mask.sum(-1).float().mean().item(),
            "time/gen_s": t_gen}, max_len=cfg.max_new_tokens)
    return sample
