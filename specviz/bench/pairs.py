"""The pairs one `specviz bench` runs, all made from one load: the target on its tuned kernels beside the draft as
loaded (the AR lane's and transformers'), the speculative lane's pair (the cheaper draft, the tuned target, each
one-token step chosen on the pair as the runs use it), the cheaper draft on the kernels as loaded (the untuned
lanes'), transformers' assistants, and the pair whose step costs the cost model measures, after the runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from specviz.bench.runner import Plan
from specviz.models import PairSpec
from specviz.models.draft import DraftQuant
from specviz.models.pair import ModelPair

Status = Callable[[str], None]


@dataclass(frozen=True)
class BenchPairs:
    """Every pair a bench runs, and how its cheaper draft was made (each pair shares the loaded weights it keeps)."""

    loaded: ModelPair  # the draft as loaded and the target at its precision, on the kernels as loaded
    pair: ModelPair  # the target on its tuned kernels beside the draft as loaded: the AR lane's and transformers'
    spec_pair: ModelPair  # the speculative lane's: the cheaper draft, the tuned target, the chosen one-token steps
    cheap: ModelPair  # the cheaper draft beside the target as loaded: the untuned lanes' (`--also-untuned`)
    tuning: object | None  # the target's kernel table (`kernels.Tuning`; None: the kernels as loaded)
    quant: DraftQuant
    vocab_ids: object | None  # the cheaper draft's cut head (None: the whole vocabulary)


def tuned_target(spec: PairSpec, status: Status, progress: bool = True) -> tuple[ModelPair, ModelPair, object | None]:
    """(loaded, pair, tuning): the pair as loaded (the cheaper draft and the steps are chosen later, on the pair as
    the runs use it), and the same with its target at its precision on the kernels asked for. `progress`: the
    loading's progress bars (transformers' "Loading weights"), off for `--no-progress`."""
    from specviz.models import load_spec
    from specviz.models.target import with_target

    loaded = load_spec(replace(spec, draft_quant="none", draft_vocab=0, kernels="plain", step="eager"),
                       progress=progress)
    pair, tuning = with_target(loaded, "none", spec.kernels, status=status, invariant=spec.invariant)
    return loaded, pair, tuning


def drafter_problem_of(plan: Plan, pair: ModelPair) -> str | None:
    """Why one of the plan's settings cannot draft on this pair, in one sentence (None: all can)."""
    from specviz.engine.drafters import drafter_problem

    return next(filter(None, (drafter_problem(c.drafter, pair.draft, pair.target, c.exit_layer, pair.vocab_map)
                              for c in plan.settings())), None)


def bench_pairs(loaded: ModelPair, pair: ModelPair, tuning, spec: PairSpec, quant: DraftQuant, lean: bool,
                status: Status) -> BenchPairs:
    """`tuned_target`'s pairs with the cheaper draft (`quant`, the lean step or not, its head cut as `spec` asks)
    and the speculative lane's pair on the tuned kernels and the chosen steps."""
    from specviz.models.cut_head import draft_vocab_ids
    from specviz.models.draft import with_cheaper_draft
    from specviz.models.steps import with_steps
    from specviz.models.target import with_tuned_draft

    vocab_ids = draft_vocab_ids(loaded, spec.draft_vocab)
    cheap = with_cheaper_draft(loaded, quant, lean=lean, vocab_ids=vocab_ids)
    spec_pair = replace(cheap, target=pair.target, target_name=pair.target_name)
    if tuning is not None:
        spec_pair = with_tuned_draft(spec_pair)
    spec_pair = with_steps(loaded, spec_pair, spec, status=status)
    return BenchPairs(loaded, pair, spec_pair, cheap, tuning, quant, vocab_ids)


def hf_baseline(pair: ModelPair, plan: Plan):
    """transformers' generate() on the tuned target, with the same warps and seed as specviz's runs."""
    from specviz.bench.hf import HFGenerate

    return HFGenerate(pair.target, pair.eos_token_ids, pair.tokenizer.pad_token_id, pair.device,
                      plan.config.sampling, plan.config.seed)


def hf_assistants(pairs: BenchPairs, plan: Plan) -> dict[str, object]:
    """The drafts transformers' assisted generation gets: "same", specviz's cheaper draft through the Hugging Face
    forward generate() needs (a compiled step's draft as loaded), and "loaded", the draft as a user would hand it
    over, where it differs. None for lookup (transformers' own prompt lookup runs instead), for self (not wired yet:
    generate(assistant_early_exit=L)) and for a draft of another family (it would need both tokenizers)."""
    from specviz.models.compiled import is_compiled
    from specviz.models.draft import cheaper_draft
    from specviz.models.draft.lean import LeanDraft

    pair, draft = pairs.pair, pairs.spec_pair.draft
    if plan.config.drafter in ("lookup", "self") or pair.vocab_map is not None:
        return {}
    same = cheaper_draft(pair, pairs.quant, lean=False, vocab_ids=pairs.vocab_ids) if isinstance(draft, LeanDraft) \
        else pair.draft if is_compiled(draft) else draft
    return {"same": same, **({"loaded": pair.draft} if same is not pair.draft else {})}


def cost_exit_layer(plan: Plan) -> int | None:
    """The exit layer whose draft step the cost model measures for the 'self' drafter: the plan's one layer;
    None for a sweep, where one draft cost would mispredict every other layer."""
    layers = {c.exit_layer for c in plan.settings()}
    return layers.pop() if len(layers) == 1 else None


def cost_pair_of(pairs: BenchPairs, plan: Plan) -> ModelPair | None:
    """The pair whose steps the cost model times: the speculative lane's; for 'self', its draft step is the
    target's early exit (none for a sweep); none for prompt lookup alone (no draft step to time)."""
    from specviz.engine.early_exit import EarlyExit

    if plan.config.drafter == "self":
        layer = cost_exit_layer(plan)
        return replace(pairs.spec_pair, draft=EarlyExit(pairs.pair.target, layer)) if layer else None
    return None if pairs.spec_pair.draft is None else pairs.spec_pair


def measured_costs(pairs: BenchPairs, cost_pair: ModelPair | None, first_ids: list[int], widest: int, plan: Plan,
                   untuned: bool) -> tuple[object | None, float | None, object | None]:
    """(cost, its CPU stall, the same curve on the kernels as loaded where `untuned`), up to `widest` tokens. Taken
    after the runs, in their steady state (measured first, a fresh process's first forwards ran up to 30 % slower
    for a while, which bent the curve against the one-token step)."""
    from specviz.bench.costs import measure_costs

    if cost_pair is None:
        return None, None, None
    cost, stall = measure_costs(cost_pair, first_ids, widest, max_stall=plan.max_stall, retries=plan.retries)
    if not untuned:
        return cost, stall, None
    draft = pairs.cheap.draft if cost_pair.draft is pairs.spec_pair.draft else cost_pair.draft
    plain, _ = measure_costs(replace(cost_pair, target=pairs.loaded.target, draft=draft), first_ids, widest,
                             max_stall=plan.max_stall, retries=plan.retries)
    return cost, stall, plain
