"""The prompts the app offers: each shows one thing about speculative decoding on the embedded pair."""

from __future__ import annotations

# A few hundred prompt tokens: reading them (prefill) is the same work in both lanes and is not sped up,
# so the end-to-end gain shrinks while the decode-only gain holds.
LONG_MODULE = '''\
from dataclasses import dataclass, field
from datetime import date


@dataclass
class Item:
    sku: str
    name: str
    price_cents: int
    quantity: int = 0
    tags: list[str] = field(default_factory=list)


@dataclass
class Inventory:
    items: dict[str, Item] = field(default_factory=dict)
    last_audit: date | None = None

    def add(self, item: Item) -> None:
        if item.sku in self.items:
            raise ValueError(f"duplicate sku {item.sku}")
        self.items[item.sku] = item

    def restock(self, sku: str, amount: int) -> int:
        if amount <= 0:
            raise ValueError("amount must be positive")
        item = self.items[sku]
        item.quantity += amount
        return item.quantity

    def sell(self, sku: str, amount: int) -> int:
        item = self.items[sku]
        if amount > item.quantity:
            raise ValueError(f"only {item.quantity} of {sku} left")
        item.quantity -= amount
        return item.price_cents * amount

    def apply_discount(self, tag: str, percent: int) -> int:
        if not 0 < percent < 100:
            raise ValueError("percent must be between 1 and 99")
        changed = 0
        for item in self.items.values():
            if tag in item.tags:
                item.price_cents = item.price_cents * (100 - percent) // 100
                changed += 1
        return changed

    def value_cents(self) -> int:
        return sum(item.price_cents * item.quantity for item in self.items.values())
'''

EXAMPLES = [
    ("Code (high acceptance)", "Write a Python function `is_prime(n)` with a docstring and type hints, "
     "then a loop that prints the primes below 50."),
    ("JSON (high acceptance)", "Return only a JSON array of three fictional employees, each with the keys "
     "\"name\", \"age\", \"department\" and \"email\"."),
    ("Rewrite (try the lookup drafter)", "Rename the variable `x` to `total` and return the whole code:\n\n"
     "def add_all(items):\n    x = 0\n    for item in items:\n        x = x + item\n    return x\n"),
    ("Story (low acceptance)", "Write a short surreal story about a lighthouse keeper who collects lost colours."),
    ("Long prompt (prefill apart)", "Write pytest tests for `Inventory.sell` and `Inventory.apply_discount` in "
     "this module. Reply with only the code.\n\n" + LONG_MODULE),
]
