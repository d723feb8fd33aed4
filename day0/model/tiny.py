"""The embedded tiny model: a real checkpoint built offline, deterministically.

The harness must run end to end on a machine that cannot download weights, so it makes its own
target: a byte-level BPE tokenizer trained on a generated corpus and random weights (a dense Llama,
or a Qwen3-MoE or DeepSeek-V3 in miniature: :mod:`day0.model.tiny_archs`) split
over several safetensors shards with an index, exactly the layout real checkpoints use. The same
spec gives the same bytes, so the cache key (a hash of the spec) is safe to reuse.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from day0.config.tiny import TinySpec
from day0.core.outputs import cache_root, write_file
from day0.model import arch_tensors
from day0.model.tiny_archs import model_config, weights

BUILDER_VERSION = 3  # 3: a chat template with tool and reasoning sections; <think> and </think> tokens
MANIFEST_NAME = "day0-manifest.json"
# A role-tagged template in the Hermes tool-call convention (the `hermes` tool parser reads it):
# tools declared in the system turn as JSON, a call as <tool_call>{"name", "arguments"}</tool_call>, a
# result as <tool_response>, an earlier turn's reasoning as <think>. The agents stage renders every
# section of it through the server and through transformers and compares the token ids.
CHAT_TEMPLATE = (
    "{%- if tools %}<|system|>{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}"
    "<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    "{% elif messages[0]['role'] == 'system' %}<|system|>{{ messages[0]['content'] }}\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' and loop.first %}"
    "{%- elif m['role'] == 'assistant' %}<|assistant|>"
    "{% if m.get('reasoning_content') %}<think>{{ m['reasoning_content'] }}</think>{% endif %}{{ m['content'] or '' }}"
    "{%- for c in m.get('tool_calls') or [] %}"
    "<tool_call>{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": {{ c['function']['arguments'] | tojson }}}"
    "</tool_call>{% endfor %}\n"
    "{% elif m['role'] == 'tool' %}<|tool|><tool_response>{{ m['content'] }}</tool_response>\n"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Added (not special) tokens, as DeepSeek-R1 and Qwen3 have them: vLLM's think-tag reasoning parsers
# (deepseek_r1, qwen3) look the two up in the vocabulary and refuse a tokenizer without them.
THINK, END_THINK = "<think>", "</think>"

_WORDS = (
    "the model serves tokens across nodes while the cache keeps blocks of keys and values "
    "prefill decode latency throughput shard tensor weight layer attention head rank ring "
    "tree bandwidth link switch memory page block fragment context window request batch "
    "queue schedule sample greedy token byte vocabulary merge pipeline tensor parallel "
    "supernode acceptance report signed baseline nightly regression check verdict stage"
).split()


def spec_digest(spec: TinySpec) -> str:
    payload = json.dumps({"builder": BUILDER_VERSION, **spec.identity()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cached_model(spec: TinySpec, *, log: Callable[[str], None] | None = None) -> Path:
    """Path of the model for ``spec``, building it once; concurrent builders race harmlessly."""
    arch = "" if spec.arch == "llama" else f"{spec.arch}-"  # the dense name predates the MoE targets
    target = cache_root() / f"tiny-{arch}{spec_digest(spec)}"
    if (target / "model.safetensors.index.json").is_file():
        if not (target / MANIFEST_NAME).is_file():  # built before builds wrote one
            write_manifest(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        if log:
            log(f"building tiny model {target.name} (spec hash {spec_digest(spec)})")
        build(spec, staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "model.safetensors.index.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# The embedded model is a rehearsal on CPU (2.6M parameters by default): every weight is drawn in
# memory before a shard is written, so a spec within each dimension's range but 122B parameters in
# all died of the allocator, with a traceback, after minutes. 1 GiB of float32 at most.
MAX_TINY_PARAMS = 1 << 28


def build(spec: TinySpec, out_dir: Path) -> Path:
    """Write tokenizer, config and sharded weights into ``out_dir`` (created if missing)."""
    params = arch_tensors.parameter_count(model_config(spec, vocab_size=spec.vocab_size, bos_token_id=0, eos_token_id=1))
    if params > MAX_TINY_PARAMS:
        raise ValueError(f"model.tiny: {params:,} parameters ({params * 4 / 2**30:.1f} GiB in float32), past the "
                         f"{MAX_TINY_PARAMS:,} of a model built in memory for a rehearsal on CPU")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(spec)
    vocab = tokenizer.get_vocab_size()
    write_file(out_dir / "tokenizer.json", tokenizer.to_str(pretty=True))  # what tokenizer.save writes
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": False,
        "model_max_length": spec.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    })
    _write_json(out_dir / "special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS})
    config = model_config(spec, vocab_size=vocab, bos_token_id=bos, eos_token_id=eos)
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos})
    _write_shards(weights(spec, config), out_dir, spec.num_shards)
    write_manifest(out_dir)
    return out_dir


def write_manifest(model_dir: Path) -> Path:
    """``day0-manifest.json`` for a model this builder wrote: the build is the trusted copy, so the
    weights stage's ``weights.manifest`` verifies the embedded model on every run instead of skipping.

    The format is the weights stage's (``day0.stages.weights.manifest``, which reads it; a stage
    is above this layer, so the few lines are here); a test holds the two to the same bytes.
    """
    model_dir = Path(model_dir)
    names = sorted(p.name for p in model_dir.glob("*.safetensors"))
    names += [n for n in ("model.safetensors.index.json", "config.json") if (model_dir / n).is_file()]
    files = {}
    for name in sorted(names):
        digest = hashlib.sha256()
        with open(model_dir / name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
        files[name] = {"size": (model_dir / name).stat().st_size, "sha256": digest.hexdigest()}
    doc = {"format": "day0-manifest", "version": 1, "algorithm": "sha256", "created_by": "day0.model.tiny",
           "files": files}
    return write_file(model_dir / MANIFEST_NAME, json.dumps(doc, indent=1) + "\n")


def _corpus(seed: int, sentences: int = 3000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + "." for _ in range(sentences)]


def _train_tokenizer(spec: TinySpec):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK, END_THINK)])
    return tok


def _write_shards(tensors: dict[str, Any], out_dir: Path, num_shards: int) -> None:
    """Split in insertion order into shards of roughly equal bytes, as HF's sharding does."""
    from safetensors.torch import save

    names = list(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    num_shards = max(1, min(num_shards, len(names)))
    per_shard = total / num_shards
    groups: list[list[str]] = [[] for _ in range(num_shards)]
    acc = 0
    for idx, name in enumerate(names):
        remaining_names = len(names) - idx
        shard = min(int(acc // per_shard), num_shards - 1)
        # never leave a later shard empty
        shard = max(shard, num_shards - remaining_names)
        groups[shard].append(name)
        acc += tensors[name].numel() * tensors[name].element_size()
    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups, 1):
        fname = f"model-{k:05d}-of-{num_shards:05d}.safetensors"
        write_file(out_dir / fname, save({n: tensors[n] for n in group}, metadata={"format": "pt"}))  # save_file's bytes
        weight_map.update({n: fname for n in group})
    _write_json(out_dir / "model.safetensors.index.json", {
        "metadata": {"total_size": total},
        "weight_map": dict(sorted(weight_map.items())),
    })


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_file(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
