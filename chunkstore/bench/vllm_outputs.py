"""Whether a system's greedy outputs are vLLM alone's: request by request, client by client, in
the same repetition and phase.

Invariants: two requests are compared only when their prompts are the same tokens (the prompts'
digests), so a client whose history parted at a near tie is not compared further; a difference
is a near tie only when each run's token was among the other's best candidates, within
NEAR_TIE_NATS of its first (bf16 KV computed in another batch or chunk differs in its last bits,
as with vLLM's own prefix cache); any other difference is reported, as wrong KV would be.
"""

from __future__ import annotations

NEAR_TIE_NATS = 0.1
IDENTICAL, NEAR_TIES, DIFFER = "identical", "near ties", "differ"


def _gap_nats(best: list, token: int) -> float | None:
    """How far below this run's first choice ``token`` was, in nats; None when it was not among
    the candidates kept (``best``: (id, logprob), best first)."""
    return next((best[0][1] - lp for t, lp in best if t == token), None)


def _is_near_tie(best: list, other_token: int) -> bool:
    gap = _gap_nats(best, other_token)
    return gap is not None and gap <= NEAR_TIE_NATS


def compare_outputs(base: list[dict], other: list[dict]) -> dict:
    """``other``'s records against ``base``'s (vLLM alone's), each client's rounds in order up to
    its first difference or its first prompt that is not the same. Returns the verdict
    (``identical``, ``near ties`` or ``differ``), the requests compared and not compared, and each
    divergence."""
    by_base = {(r["client"], r["round"]): r for r in base}
    by_other = {(r["client"], r["round"]): r for r in other}
    compared = not_compared = 0
    near_ties: list[dict] = []
    differences: list[dict] = []
    for client in sorted({c for c, _ in by_base}):
        rounds = sorted(r for c, r in by_base if c == client)
        for k, round_index in enumerate(rounds):
            b, o = by_base[client, round_index], by_other.get((client, round_index))
            if o is None or o.get("prompt_digest") != b.get("prompt_digest"):
                not_compared += len(rounds) - k  # another prompt: an earlier reply parted (or it is missing)
                break
            compared += 1
            if o["output_ids"] == b["output_ids"]:
                continue
            i = next((j for j, (x, y) in enumerate(zip(b["output_ids"], o["output_ids"])) if x != y), None)
            where = {"client": client, "round": round_index, "token_index": i}
            if i is not None and _is_near_tie(b["best"][i], o["output_ids"][i]) \
                    and _is_near_tie(o["best"][i], b["output_ids"][i]):
                near_ties.append({**where, "gap_nats": [_gap_nats(b["best"][i], o["output_ids"][i]),
                                                        _gap_nats(o["best"][i], b["output_ids"][i])]})
            else:
                differences.append({**where, "vllm": b["output_ids"], "this": o["output_ids"],
                                    "vllm_best": b["best"][i] if i is not None else None,
                                    "this_best": o["best"][i] if i is not None else None})
            not_compared += len(rounds) - k - 1  # this client's later prompts hold another reply
            break
    verdict = DIFFER if differences else NEAR_TIES if near_ties else IDENTICAL
    return {"verdict": verdict, "compared_requests": compared, "not_compared_requests": not_compared,
            "near_tie_nats": NEAR_TIE_NATS, "near_tie_divergences": near_ties, "differences": differences}
