#!/usr/bin/env python3
"""Build a tiny random-weight chat model for `transformers serve`, offline, nothing from a hub.

Run with the ENGINE venv's python (it needs torch, transformers, tokenizers; see scripts/engine-venv):

    /work/engine-venv/bin/python scripts/engine/build_tiny_model.py OUT_DIR

OUT_DIR gets a Llama-architecture model (2 layers, hidden 64, ~0.2 M parameters, random weights from a fixed
seed), a byte-level BPE tokenizer trained here on a generated corpus, and a chat template, so that
`/v1/chat/completions` works. The answers are gibberish: the model is for exercising a real serving stack (HTTP,
SSE, continuous batching, usage counts), not for its words. Idempotent: a directory already holding a model built
by this same script version is left alone (``--force`` rebuilds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VERSION = 2  # bump when the model changes; the stamp file makes rebuilds idempotent
STAMP = "evalsup_tiny_model.json"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = (
    "the a an of to in is it that for on with as was by be this are from at or have not but what all were "
    "when we there can one your which their said each she do how if will up other about out many then them "
    "these so some her would make like him into time has look two more write go see number no way could "
    "people my than first water been call who oil its now find long down day did get come made may part "
    "question answer model server request token batch latency throughput evaluate score result task file "
    "number capital france paris city river mountain ocean planet star light sound energy reason think"
)
SPECIAL = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


def corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic English-ish text: enough for a BPE vocabulary of real-looking sub-words."""
    words = WORDS.split()
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        n = rng.randint(4, 16)
        s = " ".join(rng.choice(words) for _ in range(n))
        lines.append(s[0].upper() + s[1:] + rng.choice([".", "?", "!", ", and 42.", " (1, 2, 3)."]))
    return lines


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>",
                                   pad_token="<|pad|>", model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True, dtype="float32",
    )
    model = LlamaForCausalLM(config)
    # The default init (std 0.02) makes greedy decoding repeat one token ("\n\n\n..."); std 0.2 gives answers
    # that differ from prompt to prompt, so a record's text shows it came from the model.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.2)
    model.generation_config = GenerationConfig(
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        max_new_tokens=32, do_sample=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    (out / STAMP).write_text(json.dumps({"version": VERSION, "parameters": params, "vocab": len(fast)}) + "\n")
    print(f"built {out}: {params:,} parameters, vocabulary {len(fast)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory to write the model to")
    ap.add_argument("--force", action="store_true", help="rebuild even if OUT already holds this version")
    a = ap.parse_args(argv)
    stamp = a.out / STAMP
    if not a.force and stamp.exists():
        try:
            if json.loads(stamp.read_text()).get("version") == VERSION:
                print(f"{a.out}: tiny model v{VERSION} already built")
                return 0
        except (OSError, ValueError):
            pass
    build(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
