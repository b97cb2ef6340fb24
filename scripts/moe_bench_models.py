#!/usr/bin/env python3
"""Skeletons (GGUF headers: metadata, tokenizer, tensor table; no weights) of two models for the
mixture-of-experts benchmark, for `hearth models synth` to fill with random weights:

- `qwen3moe-30b-a3b-L<n>`: Qwen3-30B-A3B's layer shapes (n_embd 2048, 32 query and 4 KV heads of
  128, 128 experts of 768 with 8 per token, vocabulary 151,936) with fewer layers, so that it fits
  this machine;
- `qwen3-dense-a3b-L<n>`: the same model with a dense FFN of 8 x 768 = 6144 in place of the
  experts: the same parameters read per token;
- `deepseek2-v2-lite-L<n>`: DeepSeek-V2-Lite's (multi-head latent attention, 64 experts of 1408
  with 6 per token and 2 shared, a leading dense layer), with fewer layers.

Matrices Q4_K, the output head Q6_K, router and norms F32 (as a Q4_K_M file of the real model
has them, roughly). The tokenizer is Qwen2.5's, read from a GGUF given with --tokenizer-from.

    python3 scripts/moe_bench_models.py --tokenizer-from QWEN.gguf --layers 8 --out DIR
    hearth models synth DIR/qwen3moe-30b-a3b-L8.skel.gguf -o DIR/qwen3moe-30b-a3b-L8.gguf
"""
import argparse
import pathlib

import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/synthetic"))
from make_models import add_mla_keys  # noqa: E402

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 2048, 32, 4, 128
N_EXPERT, N_USED, N_FF_EXP = 128, 8, 768


def copy_tokenizer(reader, writer):
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            item = field.types[1]
            if item == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(field.name, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(field.name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            writer.add_key_value(field.name, field.parts[field.data[0]].tolist()[0], kind)


def nbytes(ty, shape):
    block, size = gguf.GGML_QUANT_SIZES[ty]
    n = int(np.prod(shape))
    return n // block * size


def skeleton(path, arch, n_layer, n_vocab, reader):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"hearth benchmark {path.stem}")
    w.add_block_count(n_layer)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    moe = arch == "qwen3moe"
    if moe:
        w.add_feed_forward_length(6144)
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
    else:
        w.add_feed_forward_length(N_USED * N_FF_EXP)
    copy_tokenizer(reader, w)
    tensors = [("token_embd.weight", (n_vocab, N_EMBD), Q.Q4_K), ("output_norm.weight", (N_EMBD,), Q.F32),
               ("output.weight", (n_vocab, N_EMBD), Q.Q6_K)]
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for il in range(n_layer):
        p = f"blk.{il}."
        tensors += [(p + "attn_norm.weight", (N_EMBD,), Q.F32), (p + "attn_q.weight", (q, N_EMBD), Q.Q4_K),
                    (p + "attn_k.weight", (kv, N_EMBD), Q.Q4_K), (p + "attn_v.weight", (kv, N_EMBD), Q.Q6_K),
                    (p + "attn_q_norm.weight", (HEAD_DIM,), Q.F32), (p + "attn_k_norm.weight", (HEAD_DIM,), Q.F32),
                    (p + "attn_output.weight", (N_EMBD, q), Q.Q4_K), (p + "ffn_norm.weight", (N_EMBD,), Q.F32)]
        if moe:
            tensors += [(p + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD), Q.F32),
                        (p + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), Q.Q4_K),
                        (p + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), Q.Q4_K),
                        (p + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF_EXP), Q.Q6_K)]
        else:
            ff = N_USED * N_FF_EXP
            tensors += [(p + "ffn_gate.weight", (ff, N_EMBD), Q.Q4_K), (p + "ffn_up.weight", (ff, N_EMBD), Q.Q4_K),
                        (p + "ffn_down.weight", (N_EMBD, ff), Q.Q6_K)]
    finish(w, path, tensors)


def deepseek2_skeleton(path, n_layer, n_vocab, reader):
    """DeepSeek-V2-Lite's shapes: MLA (16 heads, a latent of 512, keys of 128 + 64 rotated,
    values of 128; YaRN x40), one leading dense layer of 10944, then 64 experts of 1408 with 6
    per token and 2 shared."""
    n_head, kv_lora, qk_nope, qk_rope, v_head = 16, 512, 128, 64, 128
    n_expert, n_used, n_ff_exp, n_shared, n_ff = 64, 6, 1408, 2, 10944
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_name(f"hearth benchmark {path.stem}")
    w.add_block_count(n_layer)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_shared_count(n_shared)
    w.add_leading_dense_block_count(1)
    w.add_expert_weights_scale(1.0)
    w.add_expert_weights_norm(False)
    add_mla_keys(w, q_lora=0, kv_lora=kv_lora, qk_nope=qk_nope, qk_rope=qk_rope, v_head=v_head)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(40.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_rope_scaling_yarn_log_mul(0.0707)
    copy_tokenizer(reader, w)
    tensors = [("token_embd.weight", (n_vocab, N_EMBD), Q.Q4_K), ("output_norm.weight", (N_EMBD,), Q.F32),
               ("output.weight", (n_vocab, N_EMBD), Q.Q6_K)]
    for il in range(n_layer):
        p = f"blk.{il}."
        # Rows that are not whole 256-value super-blocks (the per-head latent projections' 128
        # and 512, the down projections' 10944 and 1408) in Q8_0, llama.cpp's fallback for them.
        tensors += [(p + "attn_norm.weight", (N_EMBD,), Q.F32),
                    (p + "attn_q.weight", (n_head * (qk_nope + qk_rope), N_EMBD), Q.Q4_K),
                    (p + "attn_kv_a_mqa.weight", (kv_lora + qk_rope, N_EMBD), Q.Q4_K),
                    (p + "attn_kv_a_norm.weight", (kv_lora,), Q.F32),
                    (p + "attn_k_b.weight", (n_head, kv_lora, qk_nope), Q.Q8_0),
                    (p + "attn_v_b.weight", (n_head, v_head, kv_lora), Q.Q8_0),
                    (p + "attn_output.weight", (N_EMBD, n_head * v_head), Q.Q4_K),
                    (p + "ffn_norm.weight", (N_EMBD,), Q.F32)]
        if il == 0:
            tensors += [(p + "ffn_gate.weight", (n_ff, N_EMBD), Q.Q4_K), (p + "ffn_up.weight", (n_ff, N_EMBD), Q.Q4_K),
                        (p + "ffn_down.weight", (N_EMBD, n_ff), Q.Q8_0)]
            continue
        f = n_shared * n_ff_exp
        tensors += [(p + "ffn_gate_inp.weight", (n_expert, N_EMBD), Q.F32),
                    (p + "ffn_gate_exps.weight", (n_expert, n_ff_exp, N_EMBD), Q.Q4_K),
                    (p + "ffn_up_exps.weight", (n_expert, n_ff_exp, N_EMBD), Q.Q4_K),
                    (p + "ffn_down_exps.weight", (n_expert, N_EMBD, n_ff_exp), Q.Q8_0),
                    (p + "ffn_gate_shexp.weight", (f, N_EMBD), Q.Q4_K), (p + "ffn_up_shexp.weight", (f, N_EMBD), Q.Q4_K),
                    (p + "ffn_down_shexp.weight", (N_EMBD, f), Q.Q6_K)]
    finish(w, path, tensors)


def finish(w, path, tensors):
    for name, shape, ty in tensors:
        # The shape in values (a uint8 dtype would make gguf-py read it as bytes).
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes(ty, shape), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    # The tensor data would start at the next multiple of the alignment: a skeleton ends there.
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\0" * (-size % gguf.GGUF_DEFAULT_ALIGNMENT))
    print(f"{path}: {len(tensors)} tensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-from", required=True, help="a Qwen2.5 GGUF (its tokenizer is copied)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    reader = gguf.GGUFReader(args.tokenizer_from)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skeleton(out / f"qwen3moe-30b-a3b-L{args.layers}.skel.gguf", "qwen3moe", args.layers, n_vocab, reader)
    skeleton(out / f"qwen3-dense-a3b-L{args.layers}.skel.gguf", "qwen3", args.layers, n_vocab, reader)
    deepseek2_skeleton(out / f"deepseek2-v2-lite-L{args.layers}.skel.gguf", args.layers, n_vocab, reader)


if __name__ == "__main__":
    main()
