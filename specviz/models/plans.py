"""Which kernel multiplies each number of rows, from what each took on this machine: the plan of one linear shape.

`choose` takes the fastest kernel for every row count, a row count padded to a larger one where that is faster
(so none costs more than a larger one), a near tie (`TIE`) going to fewer rows and the module's own kernel.
`lean_plans` then keeps one copy of each weight: a plan whose kernels read two forms of a weight (the weight as
loaded and a packed copy) gives way to the best plan on one form, unless the model's race would pay more than
`LEAN_COST` of its time for it, at a race's mix of widths (`RACE_MIX`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.kernels import amx, streamed
from specviz.models.kernel_table import Costs

MAX_PAD_ROWS = 17  # row counts timed one by one (the default K + 1 = 9, a tree of 16); larger ones are bucketed
BUCKETS = (24, 32, 48, 64, 128)  # prompt chunks and the widest trees: no padding, the kernel only (above 128: its choice)
TIE = 0.03  # options timed within 3 % of the fastest count as equal (repeated timings differ by about that)
LEAN_COST = 0.03  # the share of a race's time one copy of each weight may cost before some keep two forms
# the rows a race multiplies, weighted by how often: 64 new tokens are 64 one-token steps (the target alone) and about
# 16 verifies of K + 1 = 9 rows, after a prompt of a few 64-row chunks
RACE_MIX = {1: 16, 9: 4, 64: 1}
# the copy of the weight a kernel reads (`kernels.kernels_of` names the kernels)
FORMS = {"dense": "as loaded", "native": "as loaded", "onednn": "packed",
         **dict.fromkeys([*streamed.SUMS, *amx.SUMS], "streamed")}


@dataclass(frozen=True)
class Choice:
    kernel: str
    rows: int  # run as this many rows (>= the rows asked for; the padding rows are dropped)


def sizes(max_rows: int = MAX_PAD_ROWS) -> list[int]:
    return [*range(1, max_rows + 1), *(b for b in BUCKETS if b > max_rows)]


def choose(costs: Costs, max_pad_rows: int = MAX_PAD_ROWS) -> dict[int, Choice]:
    """For every measured row count, the kernel and padded size with the least measured time.

    Up to `max_pad_rows`, n rows may run as any measured m >= n rows (m <= max_pad_rows) on any kernel, so
    no row count costs more than a larger one (beyond TIE); above it (prompt chunks) only the kernel is chosen."""
    measured = sorted({m for per in costs.values() for m in per})
    kernels = list(costs)  # the module's own kernel first: it wins a tie
    plan = {}
    for n in measured:
        options = [(t, m, kernels.index(k), Choice(k, m)) for k, per in costs.items() for m, t in per.items()
                   if m == n or (n < m <= max_pad_rows)]
        best = min(o[0] for o in options)
        # within TIE of the fastest, the fewest rows and the module's own kernel: noise does not pick a padding
        plan[n] = min((o for o in options if o[0] <= best * (1 + TIE)), key=lambda o: o[1:3])[3]
    return plan


def form_of(kernel: str) -> str:
    return FORMS.get(kernel, kernel)  # a quantized linear's kernel reads its own packed weights


def plan_cost(costs: Costs, plan: dict[int, Choice], mix: dict[int, int] = RACE_MIX) -> float:
    return sum(weight * costs[plan[n].kernel][plan[n].rows] for n, weight in mix.items() if n in plan)


def forms_of(plan: dict[int, Choice]) -> tuple[str, ...]:
    return tuple(sorted({form_of(c.kernel) for c in plan.values()}))


def one_form_plan(costs: Costs, max_pad_rows: int = MAX_PAD_ROWS, mix: dict[int, int] = RACE_MIX
                  ) -> dict[int, Choice]:
    """The fastest plan whose kernels all read one form of the weight (the cheapest at a race's mix of widths)."""
    forms = sorted({form_of(k) for k in costs})
    singles = [choose({k: per for k, per in costs.items() if form_of(k) == form}, max_pad_rows) for form in forms]
    return min(singles, key=lambda plan: plan_cost(costs, plan, mix))


@dataclass(frozen=True)
class LeanChoice:
    """A shape's plan, and what one copy of its weight costs: `extra` is the one-form plan's time over the fastest
    plan's at a race's mix of widths (`RACE_MIX`): 0 where the fastest plan needs one form anyway."""

    plan: dict[int, Choice]
    forms: tuple[str, ...]
    extra: float


def lean_plans(costs: dict[str, Costs], linears: dict[str, tuple[int, int]], max_pad_rows: int = MAX_PAD_ROWS,
               limit: float = LEAN_COST, mix: dict[int, int] = RACE_MIX) -> dict[str, LeanChoice]:
    """Each shape's plan on one form of its weight, unless the whole model's race would pay more than `limit` of
    its time for that: then the shapes whose second copy buys the most time per byte keep their fastest plan.

    `linears`: per shape, how many linears of it the model has and the bytes of one's weight."""
    fastest = {s: choose(c, max_pad_rows) for s, c in costs.items()}
    one = {s: one_form_plan(c, max_pad_rows, mix) if len(forms_of(fastest[s])) > 1 else fastest[s]
           for s, c in costs.items()}
    time = {s: linears[s][0] * plan_cost(costs[s], fastest[s], mix) for s in costs}
    extra = {s: linears[s][0] * plan_cost(costs[s], one[s], mix) - time[s] for s in costs}
    budget, lean = limit * sum(time.values()), set()
    for s in sorted(costs, key=lambda s: extra[s] / max(linears[s][0] * linears[s][1], 1)):  # cheapest bytes first
        if extra[s] <= budget:
            budget -= max(extra[s], 0.0)
            lean.add(s)
    return {s: LeanChoice(one[s] if s in lean else fastest[s], forms_of(one[s] if s in lean else fastest[s]),
                          extra[s] / time[s] if time[s] else 0.0) for s in costs}


def prompt_plan(costs: Costs, plan: dict[int, Choice], max_pad_rows: int = MAX_PAD_ROWS, mix: dict[int, int] = RACE_MIX,
                limit: float = LEAN_COST) -> dict[int, Choice]:
    """The kernels that read a prompt, beside `plan` (the one-token steps' and the verifies'). A prompt's rows are
    never compared with a one-token step, and both lanes read a prompt alike, so any kernel may read it (an invariant
    `plan` stays with the steps and verifies): the fastest on the copies `plan` keeps, or on every kernel where a
    copy of its own saves the race more than `limit` of its time (at `mix`)."""
    prompt_mix = {n: w for n, w in mix.items() if n > max_pad_rows}
    kept = choose({k: per for k, per in costs.items() if form_of(k) in forms_of(plan)}, max_pad_rows)
    fastest = choose(costs, max_pad_rows)
    saved = plan_cost(costs, kept, prompt_mix) - plan_cost(costs, fastest, prompt_mix)
    return fastest if saved > limit * plan_cost(costs, plan, mix) else kept


def lookup(plan: dict[int, Choice], n: int) -> Choice:
    """The choice for n rows: its own where measured, else the kernel of the largest measured size below it."""
    if n in plan:
        return plan[n]
    below = max((m for m in plan if m <= n), default=min(plan))
    return Choice(plan[below].kernel, n)
