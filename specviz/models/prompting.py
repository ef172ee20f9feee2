"""Turn a user's prompt into token ids: instruct models get their chat template."""

from __future__ import annotations


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False))
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]
