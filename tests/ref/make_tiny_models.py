#!/usr/bin/env python3
"""Build tiny random-weight Hugging Face checkpoints and their reference scores.

Regenerate (from the repository root, with the reference venv; CPU only):

    /tmp/refenv/bin/python tests/ref/make_tiny_models.py [--only NAME ...]

    (venv: python -m venv /tmp/refenv &&
           /tmp/refenv/bin/pip install torch transformers gguf numpy safetensors tokenizers)

--only regenerates just the named folders (e.g. --only tiny-qwen3-f32). Each model depends
only on its own seeds and on the tokenizer, so the others are not needed for it. Use it when
adding a model: the same library versions on another CPU reproduce every weight, id and
greedy id bit for bit, but torch's fp32 CPU scores move in the 6th decimal (measured: up to
1.3e-5 nats on tiny-llama31, an AMD EPYC against the machine that made the committed files),
so regenerating everything would rewrite the other models' ref_score.txt for nothing.

Generated with: torch 2.15.0+cu132 (run on CPU), transformers 5.23.0,
tokenizers 0.23.3, safetensors 0.8.0, numpy 2.4.6 (python 3, Linux x86-64).
The script prints the versions it ran with; update this header if they change.
tiny-qwen3-f32 was added later with `--only tiny-qwen3-f32`, same versions, on an AMD EPYC.
Output is deterministic for given library versions (fixed seeds).

Writes, under tests/data/:
  tiny-llama31/      LlamaForCausalLM, Llama 3.1 style: rope_type llama3 (factor 8,
                     low 1, high 4, original_max_position_embeddings 64),
                     rope_theta 5e5, tied embeddings, GQA 4q/2kv heads, hidden 64,
                     3 layers, ffn 128, vocab 512 (= tokenizer size), eps 1e-5,
                     bf16 safetensors in 2 shards + model.safetensors.index.json.
                     config.json as transformers 5.x writes it (rope_parameters).
  tiny-llama31-tf4/  same checkpoint, config.json in the transformers 4.x form
                     (top-level rope_theta + rope_scaling, torch_dtype); all other
                     files are copies. Must score identically (checked here).
  tiny-qwen3/        Qwen3ForCausalLM: q_norm/k_norm, head_dim 32 != 64/4, GQA 4/2,
                     untied lm_head, rope_theta 1e6, model vocab 448 padded beyond
                     the tokenizer's 405 tokens, fp32 safetensors in one file.
  tiny-llama-fp16/   plain Llama (MHA 4/4, rope_theta 1e4, no rope scaling, untied
                     head, eps 1e-6), fp16 safetensors in one file.
  tiny-qwen3-f32/    tiny-qwen3's shape (same tokenizer, own seeds), fp32 weights with full
                     24-bit mantissas: NOT bf16-representable (the bf16 export rounds them).
                     Besides the files below: ref_score_bf16.txt and ref_greedy_bf16.txt,
                     the same references for the model whose matrices torch rounded to bf16
                     (.to(torch.bfloat16).float(): round to nearest even; norms stay fp32,
                     as ./export keeps them), computed in fp32; and in ref_info.json
                     "bf16_nll_sigma", per position (then mean_nll), the scale of how far
                     bf16 rounding of the matrices moves that nll (see bf16_sensitivity).
Each folder: config.json, generation_config.json, model*.safetensors,
tokenizer.json (byte-level BPE trained here), tokenizer_config.json
(bos/eos/chat_template/added_tokens_decoder), special_tokens_map.json, and
  ids.txt         fixed seeded random token ids (150; llama ones start with BOS)
  ref_score.txt   `i<TAB>next_id<TAB>nll` for i = 0..n-2, nll = -log softmax(logits[i])[ids[i+1]]
                  (natural log, float32 model, eager attention, %.6f), then
                  `mean_nll X ppl Y`
  ref_greedy.txt  32 greedy ids (argmax, no EOS stop) continuing ids[:10]
  ref_info.json   sharpness / sensitivity numbers and the smallest greedy top1-top2 margin

All weights but tiny-qwen3-f32's are bf16-representable (and, for the fp16 model,
fp16-representable), so the runner's default bf16 export is lossless for them and bf16
and f32 exports must both reproduce the float32 reference; tiny-qwen3-f32's bf16 export
must reproduce ref_score_bf16.txt instead, which pins the rounding (truncation misses it
by up to 0.17 nats). Magnitudes are chosen so next-token distributions are sharp (mean
max-prob > 0.3) and attention/context matters.
"""
import json
import math
import os
import random
import shutil
import sys

import numpy as np
import torch
import transformers
import tokenizers
import safetensors
from tokenizers import Tokenizer, AddedToken, models, pre_tokenizers, decoders, trainers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          AutoModelForCausalLM, AutoTokenizer)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
N_IDS = 150
N_PROMPT = 10
N_GEN = 32
MIN_MARGIN = 0.05   # smallest accepted top1-top2 logit gap during the reference greedy run
MIN_DISTINCT = 16   # the 32 reference greedy ids must contain at least this many distinct ids

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                   "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|reserved_special_token_3|>"]
QWEN_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
              ("<think>", False), ("</think>", False)]

LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


# ----------------------------------------------------------------------------- corpus

WORDS = """the of and to in is was for that with as on by at from his her it an were are
which this be or has had not but have also its their first one new two after who they been
more other some than into only time would over such can most these during made through
world many while where between about people city them under three because when well before
year years used then both known later since team part school each called found series state
government about river house music water family around light small great little north south
east west play game early history number during village system order life public against
national second three four five six seven eight nine ten hundred thousand million model token
data value weight matrix vector layer attention head query key rotary position frequency
quick brown fox jumps lazy dog morning evening coffee garden window mountain valley forest
ocean island bridge station market street library teacher student doctor engineer artist
writer reader question answer problem solution reason result because however therefore
although everything nothing something anything always never sometimes often usually maybe
running walking talking thinking writing reading building computing learning teaching
happy quiet bright dark strong gentle careful simple complex ancient modern golden silver
""".split()
NAMES = ["Alice", "Bob", "Paris", "London", "Tokyo", "Ada", "Linus", "Grace", "Euler",
         "Qwen", "Llama", "Rome", "Berlin", "Cairo", "Lima", "Oslo"]
EXTRA = ["café", "naïve", "über", "façade", "Zürich", "jalapeño", "déjà", "vu", "生命",
         "こんにちは", "Привет", "🙂", "🚀", "—", "…", "€5", "x²"]


def make_corpus(seed=1234, n_sentences=4000):
    rng = random.Random(seed)
    out = []
    for _ in range(n_sentences):
        k = rng.randint(4, 14)
        ws = []
        for j in range(k):
            r = rng.random()
            if r < 0.78:
                w = rng.choice(WORDS)
            elif r < 0.88:
                w = rng.choice(NAMES)
            elif r < 0.94:
                w = str(rng.choice([rng.randint(0, 9), rng.randint(10, 99),
                                    rng.randint(100, 99999), 1984, 2024, 3.14]))
            else:
                w = rng.choice(EXTRA)
            if rng.random() < 0.05:
                w = w + rng.choice(["'s", "'t", "'re", "'ll", "'ve", "'d"])
            ws.append(w)
        s = " ".join(ws)
        s = s[0].upper() + s[1:]
        s += rng.choice([".", ".", ".", "?", "!", ",", ":", ";", "...", " (ok)."])
        if rng.random() < 0.1:
            s = "    " + s          # indentation: whitespace runs
        if rng.random() < 0.08:
            s = "def f(x):\n    return x + " + str(rng.randint(0, 99))
        out.append(s)
        out.append(rng.choice([" ", " ", " ", "\n", "\n\n", "\t"]))
    return "".join(out)


def train_bpe(corpus, vocab_size, regex, nfc):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    if nfc:
        tok.normalizer = tokenizers.normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    lines = corpus.split("\n")
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def build_llama_tokenizer(corpus):
    tok = train_bpe(corpus, 500, LLAMA3_REGEX, nfc=False)
    base = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in LLAMA3_SPECIALS])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True      # as in Meta's Llama 3 tokenizer.json
    bos = base + LLAMA3_SPECIALS.index("<|begin_of_text|>")
    j["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                      "tokens": ["<|begin_of_text|>"]}}},
        ]}
    return Tokenizer.from_str(json.dumps(j)), base


def build_qwen_tokenizer(corpus):
    tok = train_bpe(corpus, 400, QWEN2_REGEX, nfc=True)
    base = tok.get_vocab_size()
    tok.add_tokens([AddedToken(s, special=sp, normalized=False) for s, sp in QWEN_ADDED])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = False
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False,
                           "trim_offsets": False, "use_regex": False}
    # add_tokens marks everything special=False; fix the flags
    for a in j["added_tokens"]:
        a["special"] = dict(QWEN_ADDED)[a["content"]]
    return Tokenizer.from_str(json.dumps(j)), base


def added_tokens_decoder(tok_json):
    return {str(a["id"]): {"content": a["content"], "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False, "special": a["special"]}
            for a in tok_json["added_tokens"]}


def write_tokenizer_files(d, tok, kind):
    tok.save(os.path.join(d, "tokenizer.json"))
    tj = json.loads(tok.to_str())
    if kind == "llama":
        cfg = {"added_tokens_decoder": added_tokens_decoder(tj),
               "bos_token": "<|begin_of_text|>",
               "chat_template": LLAMA3_CHAT_TEMPLATE,
               "clean_up_tokenization_spaces": True,
               "eos_token": "<|eot_id|>",
               "model_input_names": ["input_ids", "attention_mask"],
               "model_max_length": 131072,
               "tokenizer_class": "PreTrainedTokenizerFast"}
        stm = {"bos_token": {"content": "<|begin_of_text|>", "lstrip": False, "normalized": False,
                             "rstrip": False, "single_word": False},
               "eos_token": {"content": "<|eot_id|>", "lstrip": False, "normalized": False,
                             "rstrip": False, "single_word": False}}
    else:
        cfg = {"add_bos_token": False, "add_prefix_space": False,
               "added_tokens_decoder": added_tokens_decoder(tj),
               "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
               "bos_token": None,
               "chat_template": QWEN_CHAT_TEMPLATE,
               "clean_up_tokenization_spaces": False,
               "eos_token": "<|im_end|>",
               "errors": "replace",
               "model_max_length": 131072,
               "pad_token": "<|endoftext|>",
               "split_special_tokens": False,
               "tokenizer_class": "Qwen2Tokenizer",
               "unk_token": None}
        stm = {"additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
               "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False,
                             "rstrip": False, "single_word": False},
               "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False,
                             "rstrip": False, "single_word": False}}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump(stm, f, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------- weights

def round_bf16_(model, fp16_safe=False):
    with torch.no_grad():
        for p in model.parameters():
            x = p.data.to(torch.bfloat16).to(torch.float32)
            if fp16_safe:
                # bf16 values inside fp16's normal range are exact in fp16; flush the rest
                x = torch.where(x.abs() < 6.2e-5, torch.zeros_like(x), x)
                assert x.abs().max() < 60000
            p.data.copy_(x)


def init_weights_(model, g, emb_std, head_std, qk_gain, norm_range, qknorm_range):
    """Deterministic custom init (generator g). Linear weights ~ N(0, (gain/sqrt(in))^2)."""
    lo, hi = norm_range
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                a, b = qknorm_range
                p.copy_(a + (b - a) * torch.rand(p.shape, generator=g))
            elif name.endswith("norm.weight"):
                p.copy_(lo + (hi - lo) * torch.rand(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * emb_std)
            elif name.startswith("lm_head"):
                p.copy_(torch.randn(p.shape, generator=g) * head_std)
            elif p.dim() == 2:
                fan_in = p.shape[1]
                gain = qk_gain if (".q_proj." in name or ".k_proj." in name) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(fan_in))
            else:
                raise RuntimeError("unexpected parameter " + name)


# ----------------------------------------------------------------------------- reference

def load_f32(d):
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m.float()


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids], dtype=torch.long)).logits[0].to(torch.float64)


@torch.no_grad()
def score(model, ids):
    lp = torch.log_softmax(logits_of(model, ids), dim=-1)
    nll = [-lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
    return nll, lp


@torch.no_grad()
def greedy(model, prompt, n):
    ids = list(prompt)
    margins = []
    for _ in range(n):
        lg = model(torch.tensor([ids], dtype=torch.long)).logits[0, -1]
        top = torch.topk(lg, 2)
        margins.append((top.values[0] - top.values[1]).item())
        ids.append(int(top.indices[0]))
    return ids[len(prompt):], margins


def score_text(ids, nll):
    lines = ["%d\t%d\t%.6f" % (i, ids[i + 1], v) for i, v in enumerate(nll)]
    mean = sum(nll) / len(nll)
    lines.append("mean_nll %.6f ppl %.6f" % (mean, math.exp(mean)))
    return "\n".join(lines) + "\n", mean


def choose_ids(model, seed, bos, vocab_lo, vocab_hi):
    """Seeded random ids; bump the seed until the reference greedy run has no near-ties
    and does not collapse into repeating one token."""
    for s in range(seed, seed + 50):
        rng = random.Random(s)
        ids = [rng.randrange(vocab_lo, vocab_hi) for _ in range(N_IDS)]
        if bos is not None:
            ids[0] = bos
        gen, margins = greedy(model, ids[:N_PROMPT], N_GEN)
        if min(margins) >= MIN_MARGIN and len(set(gen)) >= MIN_DISTINCT:
            return s, ids, gen, margins
        print("  ids seed %d: greedy min margin %.4f (want >= %.2f), %d distinct ids (want >= %d);"
              " trying next seed" % (s, min(margins), MIN_MARGIN, len(set(gen)), MIN_DISTINCT))
    raise RuntimeError("no seed without greedy near-ties")


@torch.no_grad()
def diagnostics(model, ids, lp, rng_seed):
    p = lp.exp()
    maxp = p.max(dim=-1).values
    ent = -(p * lp).sum(-1)
    # context sensitivity: replace the first half by other random ids, look at the second half
    rng = random.Random(rng_seed)
    half = len(ids) // 2
    alt = list(ids)
    for i in range(1, half):
        alt[i] = ids[rng.randrange(1, len(ids))]
    lp2 = torch.log_softmax(logits_of(model, alt), dim=-1)
    tv = 0.5 * (lp[half:].exp() - lp2[half:].exp()).abs().sum(-1).mean().item()
    return {"mean_max_prob": round(maxp.mean().item(), 4),
            "min_max_prob": round(maxp.min().item(), 4),
            "mean_entropy_nats": round(ent.mean().item(), 4),
            "uniform_entropy_nats": round(math.log(lp.shape[-1]), 4),
            "context_tv_second_half": round(tv, 4)}


def write_refs(d, ids, nll, gen, info):
    with open(os.path.join(d, "ids.txt"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    txt, mean = score_text(ids, nll)
    with open(os.path.join(d, "ref_score.txt"), "w") as f:
        f.write(txt)
    with open(os.path.join(d, "ref_greedy.txt"), "w") as f:
        f.write(" ".join(map(str, gen)) + "\n")
    with open(os.path.join(d, "ref_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    return mean


def write_generation_config(d, cfg):
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def fresh_dir(d):
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)


def finish_model(name, d, state, ids_seed, bos, vocab_lo, vocab_hi, extra_info):
    """Reload from disk in f32, compute and write references. `state`: the state dict
    (float32, rounded) that was saved."""
    m = load_f32(d)
    s, ids, gen, margins = choose_ids(m, ids_seed, bos, vocab_lo, vocab_hi)
    nll, lp = score(m, ids)
    # sanity: the checkpoint on disk holds exactly the weights set here. (Compare with a
    # fresh model: `model` itself went through .to(bf16/fp16), which also rounds its
    # rotary inv_freq buffer.)
    fresh = type(m)(m.config).float().eval()
    fresh.load_state_dict(state, strict=True)
    ref_lg = logits_of(fresh, ids)
    dmax = (ref_lg - logits_of(m, ids)).abs().max().item()
    assert dmax < 1e-3, "reload mismatch %g" % dmax
    info = {"model": name, "ids_seed": s, "n_ids": len(ids),
            "greedy_prompt": ids[:N_PROMPT], "greedy_min_margin": round(min(margins), 4)}
    info.update(diagnostics(m, ids, lp, s))
    info.update(extra_info)
    info["versions"] = versions()
    mean = write_refs(d, ids, nll, gen, info)
    info["mean_nll"] = round(mean, 6)
    print("%-18s mean_nll %.4f  mean max-prob %.3f  entropy %.2f/%.2f  context TV %.3f  "
          "greedy min margin %.3f" % (name, mean, info["mean_max_prob"], info["mean_entropy_nats"],
                                      info["uniform_entropy_nats"],
                                      info["context_tv_second_half"], info["greedy_min_margin"]))
    return m, ids, nll, gen


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
            "numpy": np.__version__}


# ----------------------------------------------------------------------------- models

def make_llama31(corpus, tok, base):
    name = "tiny-llama31"
    d = os.path.join(DATA, name)
    fresh_dir(d)
    V = tok.get_vocab_size()
    bos = tok.token_to_id("<|begin_of_text|>")
    eot, eom, eot_text = (tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|eom_id|>"),
                          tok.token_to_id("<|end_of_text|>"))
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
        max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64},
        attention_bias=False, mlp_bias=False, bos_token_id=bos, eos_token_id=[eot_text, eom, eot],
        pretraining_tp=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(101)
    init_weights_(model, g, emb_std=0.5, head_std=None, qk_gain=2.0,
                  norm_range=(0.6, 1.6), qknorm_range=None)
    round_bf16_(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.to(torch.bfloat16).save_pretrained(d, max_shard_size="200KB")
    model.float()
    shards = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    assert len(shards) == 2 and os.path.isfile(os.path.join(d, "model.safetensors.index.json")), shards
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    assert "lm_head.weight" not in idx["weight_map"], "tied head must not be stored"
    write_tokenizer_files(d, tok, "llama")
    write_generation_config(d, {"bos_token_id": bos, "do_sample": True,
                                "eos_token_id": [eot_text, eom, eot], "temperature": 0.6,
                                "top_p": 0.9, "transformers_version": transformers.__version__})
    m, ids, nll, gen = finish_model(name, d, state, 7, bos, 0, base,
                                    {"shards": shards, "dtype": "bfloat16"})

    # plain-RoPE comparison: how much does the llama3 scaling change the scores?
    cfg2 = LlamaConfig.from_pretrained(d)
    cfg2.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
    m2 = LlamaForCausalLM(cfg2).float().eval()
    m2.load_state_dict(m.state_dict())
    nll2, _ = score(m2, ids)
    d_rope = sum(abs(a - b) for a, b in zip(nll, nll2)) / len(nll)
    print("  llama3 rope scaling vs plain rope: mean |d nll| %.4f, max %.4f"
          % (d_rope, max(abs(a - b) for a, b in zip(nll, nll2))))
    info_p = os.path.join(d, "ref_info.json")
    info = json.load(open(info_p))
    info["rope_scaling_effect_mean_abs_dnll"] = round(d_rope, 4)
    json.dump(info, open(info_p, "w"), indent=2)

    # transformers 4.x config form
    d4 = os.path.join(DATA, name + "-tf4")
    fresh_dir(d4)
    for f in os.listdir(d):
        shutil.copy(os.path.join(d, f), os.path.join(d4, f))
    c = json.load(open(os.path.join(d, "config.json")))
    rp = c.pop("rope_parameters")
    c4 = {}
    for k, v in c.items():
        if k == "dtype":
            c4["torch_dtype"] = v
        else:
            c4[k] = v
    c4["rope_theta"] = rp.pop("rope_theta")
    c4["rope_scaling"] = {"factor": rp["factor"], "high_freq_factor": rp["high_freq_factor"],
                          "low_freq_factor": rp["low_freq_factor"],
                          "original_max_position_embeddings": rp["original_max_position_embeddings"],
                          "rope_type": "llama3"}
    c4["transformers_version"] = "4.45.0"
    c4 = dict(sorted(c4.items()))
    with open(os.path.join(d4, "config.json"), "w") as f:
        json.dump(c4, f, indent=2)
        f.write("\n")
    m4 = load_f32(d4)
    assert m4.config.rope_parameters["rope_type"] == "llama3", m4.config.rope_parameters
    nll4, _ = score(m4, ids)
    gen4, _ = greedy(m4, ids[:N_PROMPT], N_GEN)
    assert nll4 == nll and gen4 == gen, "tf4 config form scores differently"
    info["model"] = name + "-tf4"
    json.dump(info, open(os.path.join(d4, "ref_info.json"), "w"), indent=2)
    print("%-18s identical scores and greedy ids to %s" % (name + "-tf4", name))


def tiny_qwen3_config(tok):
    """The tiny Qwen3 shape of tiny-qwen3 and tiny-qwen3-f32: vocabulary padded to 448 rows."""
    V = 448
    assert V > tok.get_vocab_size()
    eos_txt, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    return Qwen3Config(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_act="silu",
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        attention_bias=False, use_sliding_window=False, max_window_layers=2,
        bos_token_id=eos_txt, eos_token_id=im_end, pad_token_id=None)


def make_qwen3(corpus, tok, base):
    name = "tiny-qwen3"
    d = os.path.join(DATA, name)
    fresh_dir(d)
    ntok = tok.get_vocab_size()
    cfg = tiny_qwen3_config(tok)
    V, eos_txt, im_end = cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_id
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(202)
    init_weights_(model, g, emb_std=1.0, head_std=0.4, qk_gain=1.0,
                  norm_range=(0.6, 1.6), qknorm_range=(0.5, 2.5))
    with torch.no_grad():
        # Like the real Qwen checkpoints, the padded rows (ids >= tokenizer size) get small
        # logits: never the argmax, but they still count in the softmax denominator.
        model.lm_head.weight[ntok:] *= 0.25
    round_bf16_(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.float().save_pretrained(d, max_shard_size="100MB")
    assert os.path.isfile(os.path.join(d, "model.safetensors"))
    write_tokenizer_files(d, tok, "qwen")
    write_generation_config(d, {"bos_token_id": eos_txt, "do_sample": True,
                                "eos_token_id": [im_end, eos_txt], "pad_token_id": eos_txt,
                                "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                "transformers_version": transformers.__version__})
    m, ids, nll, gen = finish_model(name, d, state, 11, None, 0, base,
                                    {"dtype": "float32", "tokenizer_size": ntok, "model_vocab": V})
    assert max(gen) < ntok, "greedy picked a padded id"
    # the padded ids must matter in the scores (softmax over all 448 logits, as HF does)
    with torch.no_grad():
        lg = logits_of(m, ids)
    lp_trunc = torch.log_softmax(lg[:, :ntok], dim=-1)
    d_pad = [abs(nll[i] + lp_trunc[i, ids[i + 1]].item()) for i in range(len(ids) - 1)]
    print("  softmax over tokenizer ids only (wrong) would change nll by mean %.4f, max %.4f"
          % (sum(d_pad) / len(d_pad), max(d_pad)))


def make_llama_fp16(corpus, tok, base):
    name = "tiny-llama-fp16"
    d = os.path.join(DATA, name)
    fresh_dir(d)
    V = tok.get_vocab_size()
    bos = tok.token_to_id("<|begin_of_text|>")
    eot = tok.token_to_id("<|eot_id|>")
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, hidden_act="silu",
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=bos, eos_token_id=eot)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(303)
    init_weights_(model, g, emb_std=1.0, head_std=0.45, qk_gain=2.0,
                  norm_range=(0.6, 1.6), qknorm_range=None)
    round_bf16_(model, fp16_safe=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.to(torch.float16).save_pretrained(d, max_shard_size="100MB")
    model.float()
    write_tokenizer_files(d, tok, "llama")
    write_generation_config(d, {"bos_token_id": bos, "do_sample": True, "eos_token_id": eot,
                                "temperature": 0.8, "top_p": 0.95, "top_k": 40,
                                "transformers_version": transformers.__version__})
    finish_model(name, d, state, 13, bos, 0, base, {"dtype": "float16"})


BF16_U = 2.0 ** -8   # bf16 keeps 8 significant bits: round to nearest moves |w| by <= 2^-8 |w|


def is_matrix(name, p):
    """The tensors ./export stores in bf16 by default: every matrix (norms stay fp32)."""
    return p.dim() == 2


def bf16_sensitivity(m, ids, w_bf16):
    """How bf16 rounding of the matrices moves each nll, to first order. In float64 around the
    fp32 weights w of model m, with g_i = d nll_i / d w over the matrices (autograd):
      worst_i = 2^-8 sum |g_i| |w|: |d nll_i| over the worst rounding with |dw| <= 2^-8 |w|
                (every error lined up against the gradient);
      sigma_i = 2^-8 sqrt(sum (g_i w)^2): Hoeffding's scale for sum g_i dw when the rounding
                errors are independent, zero mean (round to nearest) and |dw| <= 2^-8 |w|:
                P(|d nll_i| > k sigma_i) <= 2 exp(-k^2 / 2);
      lin_i   = sum g_i (w_bf16 - w): the first-order prediction of the actual change.
    The same three for mean_nll (the gradient averaged over the positions) come last."""
    md = type(m)(m.config).to(torch.float64).eval()
    md.load_state_dict({k: v.to(torch.float64) for k, v in m.state_dict().items()})
    mats = [(n, p) for n, p in md.named_parameters() if is_matrix(n, p)]
    w = [p.detach() for _, p in mats]
    dw = [w_bf16[n].to(torch.float64) - p.detach() for n, p in mats]
    lp = torch.log_softmax(md(torch.tensor([ids], dtype=torch.long)).logits[0], dim=-1)
    n = len(ids) - 1
    worst, sigma, lin = [], [], []
    gsum = [torch.zeros_like(x) for x in w]
    for i in range(n + 1):
        if i < n:
            gs = torch.autograd.grad(-lp[i, ids[i + 1]], [p for _, p in mats], retain_graph=True)
            for acc, g in zip(gsum, gs):
                acc += g / n
        else:
            gs = gsum
        worst.append(BF16_U * sum((g.abs() * x.abs()).sum().item() for g, x in zip(gs, w)))
        sigma.append(BF16_U * math.sqrt(sum(((g * x) ** 2).sum().item() for g, x in zip(gs, w))))
        lin.append(sum((g * e).sum().item() for g, e in zip(gs, dw)))
    return worst, sigma, lin


def make_qwen3_f32(corpus, tok, base):
    """tiny-qwen3's shape with weights bf16 cannot hold: the bf16 export rounds every matrix."""
    name = "tiny-qwen3-f32"
    d = os.path.join(DATA, name)
    fresh_dir(d)
    ntok = tok.get_vocab_size()
    cfg = tiny_qwen3_config(tok)
    V, eos_txt, im_end = cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_id
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(404)
    init_weights_(model, g, emb_std=1.0, head_std=0.4, qk_gain=1.0,
                  norm_range=(0.6, 1.6), qknorm_range=(0.5, 2.5))
    with torch.no_grad():
        model.lm_head.weight[ntok:] *= 0.25
    # No round_bf16_: full fp32 mantissas. Nearly every matrix element must change in bf16.
    state = {k: v.clone() for k, v in model.state_dict().items()}
    w_bf16 = {n: p.detach().to(torch.bfloat16).to(torch.float32)
              for n, p in model.named_parameters() if is_matrix(n, p)}
    n_el = sum(w.numel() for w in w_bf16.values())
    n_inexact = sum((w != state[n]).sum().item() for n, w in w_bf16.items())
    rel = max(((w - state[n]).abs() / state[n].abs().clamp_min(1e-30)).max().item()
              for n, w in w_bf16.items())
    trunc = {n: (state[n].view(torch.int32) & ~0xffff).view(torch.float32) for n in w_bf16}
    assert n_inexact > 0.99 * n_el and rel <= BF16_U, (n_inexact, n_el, rel)
    model.float().save_pretrained(d, max_shard_size="100MB")
    assert os.path.isfile(os.path.join(d, "model.safetensors"))
    write_tokenizer_files(d, tok, "qwen")
    write_generation_config(d, {"bos_token_id": eos_txt, "do_sample": True,
                                "eos_token_id": [im_end, eos_txt], "pad_token_id": eos_txt,
                                "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                "transformers_version": transformers.__version__})
    m, ids, nll, gen = finish_model(name, d, state, 17, None, 0, base,
                                    {"dtype": "float32", "tokenizer_size": ntok, "model_vocab": V})
    assert max(gen) < ntok, "greedy picked a padded id"

    # (b): the same model with its matrices rounded by torch (round to nearest even), in fp32
    def variant(ws):
        mv = load_f32(d)
        with torch.no_grad():
            for n, p in mv.named_parameters():
                if n in ws:
                    p.copy_(ws[n])
        return mv
    mb = variant(w_bf16)
    nll_b, _ = score(mb, ids)
    gen_b, margins_b = greedy(mb, ids[:N_PROMPT], N_GEN)
    assert min(margins_b) >= MIN_MARGIN and max(gen_b) < ntok, min(margins_b)
    txt, mean_b = score_text(ids, nll_b)
    with open(os.path.join(d, "ref_score_bf16.txt"), "w") as f:
        f.write(txt)
    with open(os.path.join(d, "ref_greedy_bf16.txt"), "w") as f:
        f.write(" ".join(map(str, gen_b)) + "\n")
    # what a truncating conversion would give: how far the check against (b) sits from it
    nll_t, _ = score(variant(trunc), ids)

    worst, sigma, lin = bf16_sensitivity(m, ids, w_bf16)
    mean_a = sum(nll) / len(nll)
    d_ab = [abs(x - y) for x, y in zip(nll, nll_b)]
    d_tb = [abs(x - y) for x, y in zip(nll_t, nll_b)]
    d_ta = [abs(x - y) for x, y in zip(nll_t, nll)]
    d_lin = [abs((y - x) - l) for x, y, l in zip(nll + [mean_a], nll_b + [mean_b], lin)]
    z = [x / s_ for x, s_ in zip(d_ab + [abs(mean_b - mean_a)], sigma)]
    info_p = os.path.join(d, "ref_info.json")
    info = json.load(open(info_p))
    g4 = lambda x: float("%.4g" % x)
    info.update({
        "matrix_elements": n_el, "matrix_elements_changed_by_bf16": n_inexact,
        "max_relative_bf16_rounding": g4(rel),
        "bf16_greedy_min_margin": round(min(margins_b), 4),
        "bf16_greedy_equals_f32_greedy": gen_b == gen,
        "mean_nll_bf16": round(mean_b, 6),
        "max_abs_dnll_bf16_vs_f32": g4(max(d_ab)),
        "mean_abs_dnll_bf16_vs_f32": g4(sum(d_ab) / len(d_ab)),
        "abs_dmean_nll_bf16_vs_f32": g4(abs(mean_b - mean_a)),
        "max_abs_dnll_trunc_vs_bf16": g4(max(d_tb)),
        "mean_abs_dnll_trunc_vs_bf16": g4(sum(d_tb) / len(d_tb)),
        "positions_trunc_vs_bf16_over_1e-3": sum(x > 1e-3 for x in d_tb),
        "max_abs_dnll_trunc_vs_f32": g4(max(d_ta)),
        "max_first_order_error": g4(max(d_lin)),
        "worst_case_first_order_bound_max": g4(max(worst[:-1])),
        "worst_case_first_order_bound_min": g4(min(worst[:-1])),
        "worst_case_first_order_bound_mean_nll": g4(worst[-1]),
        "max_measured_over_sigma": round(max(z), 3),
        # per position, then mean_nll last; rounded up, never below the computed value
        "bf16_nll_sigma": [math.ceil(x * 1e6) / 1e6 for x in sigma],
    })
    info["versions"] = versions()
    with open(info_p, "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    print("  %d/%d matrix elements changed by bf16 rounding, max relative change %.4g (2^-8 = %.4g)"
          % (n_inexact, n_el, rel, BF16_U))
    print("  bf16 (RNE) vs fp32: mean_nll %.6f vs %.6f, |d nll| max %.4g mean %.4g; greedy %s"
          % (mean_b, mean_a, max(d_ab), sum(d_ab) / len(d_ab),
             "equal" if gen_b == gen else "differs"))
    print("  worst case 2^-8 sum|g||w|: %.4g..%.4g (mean_nll %.4g); sigma 2^-8 sqrt(sum (g w)^2): "
          "%.4g..%.4g (mean_nll %.4g); measured/sigma max %.3f; first-order prediction off by <= %.3g"
          % (min(worst[:-1]), max(worst[:-1]), worst[-1], min(sigma[:-1]), max(sigma[:-1]),
             sigma[-1], max(z), max(d_lin)))
    print("  truncation vs RNE: |d nll| max %.4g mean %.4g, %d/%d positions over 1e-3; vs fp32 max %.4g"
          % (max(d_tb), sum(d_tb) / len(d_tb), sum(x > 1e-3 for x in d_tb), len(d_tb), max(d_ta)))


def check_tokenizer(d, text):
    t = AutoTokenizer.from_pretrained(d)
    ids = t(text, add_special_tokens=True)["input_ids"]
    assert t.decode(ids, skip_special_tokens=True) == text, "round trip failed for " + d
    chat = t.apply_chat_template([{"role": "user", "content": "Hello there"}],
                                 add_generation_prompt=True, tokenize=False)
    return len(ids), chat


MODELS = ["tiny-llama31", "tiny-llama31-tf4", "tiny-qwen3", "tiny-llama-fp16", "tiny-qwen3-f32"]


def main():
    import argparse
    ap = argparse.ArgumentParser(description="tiny checkpoints and their references")
    ap.add_argument("--only", nargs="+", choices=[n for n in MODELS if n != "tiny-llama31-tf4"],
                    help="regenerate just these (tiny-llama31 brings its -tf4 copy)")
    only = set(ap.parse_args().only or MODELS)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print("versions:", versions())
    corpus = make_corpus()
    ltok, lbase = build_llama_tokenizer(corpus)
    qtok, qbase = build_qwen_tokenizer(corpus)
    print("llama tokenizer: %d base + %d special = %d; qwen tokenizer: %d base + %d added = %d"
          % (lbase, ltok.get_vocab_size() - lbase, ltok.get_vocab_size(),
             qbase, qtok.get_vocab_size() - qbase, qtok.get_vocab_size()))
    if "tiny-llama31" in only:
        make_llama31(corpus, ltok, lbase)
        only.add("tiny-llama31-tf4")
    if "tiny-qwen3" in only:
        make_qwen3(corpus, qtok, qbase)
    if "tiny-llama-fp16" in only:
        make_llama_fp16(corpus, ltok, lbase)
    if "tiny-qwen3-f32" in only:
        make_qwen3_f32(corpus, qtok, qbase)
    sample = "Hello world, the café's 12345 tokens!\n  def f(x): return x²"
    for n in (n for n in MODELS if n in only):
        k, chat = check_tokenizer(os.path.join(DATA, n), sample)
        size = sum(os.path.getsize(os.path.join(DATA, n, f)) for f in os.listdir(os.path.join(DATA, n)))
        print("%-18s %7d bytes; sample text -> %d ids; chat prompt %r" % (n, size, k, chat))


if __name__ == "__main__":
    main()
