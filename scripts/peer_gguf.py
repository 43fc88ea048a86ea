#!/usr/bin/env python3
"""GGUF files of architecture `qwen35` for the llama.cpp comparisons, written with llama.cpp's `gguf` package.

  peer_gguf.py synthetic CONFIG.json OUT.gguf [--seed N]
      random-weight Q4_0 model at the shapes of CONFIG (a Qwen3.5 config.json, e.g. the one
      `qwen35 prepare --synthetic qwen3.5-9b` writes): every matrix Q4_0 with random nibbles and
      random block scales, vectors F32, a placeholder vocabulary of vocab_size tokens; no MTP layer.
  peer_gguf.py checkpoint DIR OUT.gguf
      the BF16 safetensors checkpoint in DIR (config.json, model*.safetensors, tokenizer.json) as F16
      matrices and F32 vectors, with its byte-level BPE tokenizer; the MTP head and the vision tower
      are left out. The tensor transforms are those of llama.cpp's convert_hf_to_gguf.py for
      Qwen3_5ForConditionalGeneration (conversion/qwen.py at the pinned source): A_log -> -exp(A_log),
      dt_bias -> ssm_dt.bias, conv1d squeezed, (1+w) norms stored as 1+w (not linear_attn.norm),
      and the Gated DeltaNet value heads reordered from grouped-by-key-head to tiled order.
  peer_gguf.py info FILE.gguf
      JSON: file bytes, bytes and weights read per decoded token (every tensor but the token
      embedding table, of which one row), bits per weight read, tensor count per type.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

ARCH = gguf.MODEL_ARCH.QWEN35


def text_config(cfg):
    return cfg.get("text_config") or cfg


def add_hparams(w, tc):
    n_layer = tc["num_hidden_layers"]
    w.add_block_count(n_layer)
    w.add_context_length(tc.get("max_position_embeddings", 262144))
    w.add_embedding_length(tc["hidden_size"])
    w.add_feed_forward_length(tc["intermediate_size"])
    w.add_head_count(tc["num_attention_heads"])
    w.add_head_count_kv(tc["num_key_value_heads"])
    w.add_key_length(tc["head_dim"])
    w.add_value_length(tc["head_dim"])
    w.add_layer_norm_rms_eps(tc["rms_norm_eps"])
    rp = tc.get("rope_parameters") or {}
    w.add_rope_freq_base(rp.get("rope_theta", tc.get("rope_theta", 1e7)))
    sec = list(rp.get("mrope_section", [11, 11, 10]))
    w.add_rope_dimension_sections((sec + [0, 0, 0, 0])[:4])
    prf = rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 0.25))
    w.add_rope_dimension_count(int(tc["head_dim"] * prf))
    w.add_ssm_conv_kernel(tc["linear_conv_kernel_dim"])
    w.add_ssm_state_size(tc["linear_key_head_dim"])
    w.add_ssm_group_count(tc["linear_num_key_heads"])
    w.add_ssm_time_step_rank(tc["linear_num_value_heads"])
    w.add_ssm_inner_size(tc["linear_value_head_dim"] * tc["linear_num_value_heads"])
    lt = tc.get("layer_types") or [("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(n_layer)]
    w.add_recurrent_layers([t == "linear_attention" for t in lt])
    w.add_full_attention_interval(tc.get("full_attention_interval", 4))
    w.add_vocab_size(tc["vocab_size"])


def shapes(tc):
    """(gguf name, numpy shape [rows, cols] or [n]) of every main-model tensor, in file order."""
    H, F, V = tc["hidden_size"], tc["intermediate_size"], tc["vocab_size"]
    nh, nkv, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    kh, vh, kd, vd = tc["linear_num_key_heads"], tc["linear_num_value_heads"], tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    K = tc["linear_conv_kernel_dim"]
    lt = tc.get("layer_types") or [("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(tc["num_hidden_layers"])]
    out = [("token_embd.weight", (V, H))]
    for i, t in enumerate(lt):
        b = f"blk.{i}."
        out.append((b + "attn_norm.weight", (H,)))
        if t == "linear_attention":
            conv = 2 * kh * kd + vh * vd
            out += [(b + "attn_qkv.weight", (conv, H)), (b + "attn_gate.weight", (vh * vd, H)),
                    (b + "ssm_conv1d.weight", (conv, K)), (b + "ssm_dt.bias", (vh,)), (b + "ssm_a", (vh,)),
                    (b + "ssm_beta.weight", (vh, H)), (b + "ssm_alpha.weight", (vh, H)),
                    (b + "ssm_norm.weight", (vd,)), (b + "ssm_out.weight", (H, vh * vd))]
        else:
            out += [(b + "attn_q.weight", (2 * nh * hd, H)), (b + "attn_k.weight", (nkv * hd, H)),
                    (b + "attn_v.weight", (nkv * hd, H)), (b + "attn_output.weight", (H, nh * hd)),
                    (b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,))]
        out += [(b + "post_attention_norm.weight", (H,)), (b + "ffn_gate.weight", (F, H)),
                (b + "ffn_up.weight", (F, H)), (b + "ffn_down.weight", (H, F))]
    out += [("output_norm.weight", (H,)), ("output.weight", (V, H))]
    return out


def placeholder_vocab(w, n):
    # byte-level symbols first, then distinct placeholders; one merge so that the BPE loader is content
    toks = [chr(0x100 + i) for i in range(256)] + ["\u0120\u0120"] + [f"<t{i}>" for i in range(n - 257)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(toks)
    w.add_token_types([gguf.TokenType.NORMAL] * n)
    w.add_token_merges(["\u0120 \u0120"])
    w.add_bos_token_id(n - 1)
    w.add_eos_token_id(n - 1)
    w.add_add_bos_token(False)


def synthetic(config_path, out_path, seed=1):
    tc = text_config(json.loads(Path(config_path).read_text()))
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[ARCH])
    add_hparams(w, tc)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    placeholder_vocab(w, tc["vocab_size"])
    plan = []
    for name, shp in shapes(tc):
        if len(shp) == 2 and "conv1d" not in name:
            rows, cols = shp
            assert cols % 32 == 0, (name, shp)
            nbytes = rows * (cols // 32) * 18
            w.add_tensor_info(name, (rows, (cols // 32) * 18), np.dtype(np.uint8), nbytes, gguf.GGMLQuantizationType.Q4_0)
        else:
            nbytes = int(np.prod(shp)) * 4
            w.add_tensor_info(name, shp, np.dtype(np.float32), nbytes)
        plan.append((name, shp))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp in plan:
        if len(shp) == 2 and "conv1d" not in name:
            rows, cols = shp
            nb = cols // 32
            for r0 in range(0, rows, 4096):          # a slice at a time: bounded memory
                r = min(4096, rows - r0)
                blk = rng.integers(0, 256, size=(r * nb, 18), dtype=np.uint8)
                # scale: fp16 in [0.5, 1) * 2^-6 (weights of magnitude ~0.01-0.1)
                d = (rng.random(r * nb, dtype=np.float32) * 0.5 + 0.5) * np.float32(2.0 ** -6)
                blk[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
                if r0 == 0:
                    w.write_padding(w.fout[0], w.fout[0].tell())
                blk.tofile(w.fout[0])
            w.write_padding(w.fout[0], rows * nb * 18)
            w.tensors[0].pop(name)
        else:
            if name.endswith("ssm_a"):
                a = -np.exp(rng.uniform(0, 2, size=shp)).astype(np.float32)
            elif "norm" in name:
                a = (1 + 0.1 * rng.standard_normal(size=shp)).astype(np.float32)
            else:
                a = (0.1 * rng.standard_normal(size=shp)).astype(np.float32)
            w.write_tensor_data(a)
    w.close()


def read_safetensors(d):
    files = sorted(Path(d).glob("*.safetensors"))
    if not files:
        raise SystemExit(f"peer_gguf: no .safetensors in {d}")
    out = {}
    for f in files:
        raw = f.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + n])
        base = 8 + n
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            buf = raw[base + a:base + b]
            if v["dtype"] == "BF16":
                x = (np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif v["dtype"] == "F32":
                x = np.frombuffer(buf, dtype=np.float32)
            elif v["dtype"] == "F16":
                x = np.frombuffer(buf, dtype=np.float16).astype(np.float32)
            else:
                raise SystemExit(f"peer_gguf: {k}: dtype {v['dtype']} not handled")
            out[k] = x.reshape(v["shape"]).copy()
    return out


def reorder_v(x, dim, nk, nvk, hd):
    """grouped-by-key-head value heads -> tiled order, along dim (convert_hf_to_gguf's _reorder_v_heads)."""
    shp = list(x.shape)
    y = x.reshape(shp[:dim] + [nk, nvk, hd] + shp[dim + 1:])
    y = np.swapaxes(y, dim, dim + 1)
    return np.ascontiguousarray(y).reshape(shp)


def tokenizer_vocab(w, d, V):
    tj = json.loads((Path(d) / "tokenizer.json").read_text())
    model = tj["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"peer_gguf: {d}/tokenizer.json: model type {model.get('type')}, only BPE is handled")
    vocab = model["vocab"]
    toks = [None] * V
    types = [gguf.TokenType.UNUSED] * V
    for t, i in vocab.items():
        if i < V:
            toks[i], types[i] = t, gguf.TokenType.NORMAL
    for a in tj.get("added_tokens", []):
        i = a["id"]
        if i >= V:
            continue
        if a.get("special"):
            toks[i], types[i] = a["content"], gguf.TokenType.CONTROL
        else:
            toks[i], types[i] = a["content"], gguf.TokenType.USER_DEFINED
    for i in range(V):
        if toks[i] is None:
            toks[i] = f"[PAD{i}]"
    merges = model.get("merges", [])
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    tcfg = json.loads((Path(d) / "tokenizer_config.json").read_text()) if (Path(d) / "tokenizer_config.json").exists() else {}

    def tok_id(s):
        if isinstance(s, dict):
            s = s.get("content")
        if s is None:
            return None
        for a in tj.get("added_tokens", []):
            if a["content"] == s:
                return a["id"]
        return vocab.get(s)
    if (e := tok_id(tcfg.get("eos_token"))) is not None:
        w.add_eos_token_id(e)
    if (p := tok_id(tcfg.get("pad_token"))) is not None:
        w.add_pad_token_id(p)
    w.add_add_bos_token(False)
    if tcfg.get("chat_template"):
        w.add_chat_template(tcfg["chat_template"])


def checkpoint(d, out_path):
    cfg = json.loads((Path(d) / "config.json").read_text())
    tc = text_config(cfg)
    st = read_safetensors(d)
    nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    kd, vd = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    nvk = nv // nk
    w = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[ARCH])
    add_hparams(w, tc)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokenizer_vocab(w, d, tc["vocab_size"])
    names = gguf.get_tensor_name_map(ARCH, tc["num_hidden_layers"])
    written = {}
    for k, x in st.items():
        if k.startswith("mtp.") or k.startswith("model.visual.") or k.startswith("model.mtp."):
            continue
        name = k.replace("model.language_model.", "model.", 1)
        if name.endswith(".A_log"):
            x = -np.exp(x)
        elif name.endswith(".dt_bias"):
            name = name[:-len(".dt_bias")] + ".dt_proj.bias"
        elif "conv1d" in name:
            x = x.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            x = x + 1
        if nk != nv and "linear_attn." in name:
            if ".in_proj_qkv." in name:
                q = 2 * kd * nk
                x = np.concatenate([x[:q], reorder_v(x[q:], 0, nk, nvk, vd)], axis=0)
            elif ".in_proj_z." in name:
                x = reorder_v(x, 0, nk, nvk, vd)
            elif ".in_proj_b." in name or ".in_proj_a." in name or ".A_log" in name or ".dt_proj" in name:
                x = reorder_v(x, 0, nk, nvk, 1)
            elif ".conv1d" in name:
                q = 2 * kd * nk
                x = np.concatenate([x[:q], reorder_v(x[q:], 0, nk, nvk, vd)], axis=0)
            elif ".out_proj." in name:
                x = reorder_v(x, 1, nk, nvk, vd)
        g = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if g is None:
            raise SystemExit(f"peer_gguf: no GGUF name for {k}")
        if x.ndim >= 2 and "conv1d" not in g:
            x = x.astype(np.float16)
        else:
            x = x.astype(np.float32)
        written[g] = x
    want = [n for n, _ in shapes(tc)]
    missing = [n for n in want if n not in written]
    extra = [n for n in written if n not in want]
    if missing or extra:
        raise SystemExit(f"peer_gguf: tensors missing {missing[:5]} unexpected {extra[:5]}")
    for n, shp in shapes(tc):
        if tuple(written[n].shape) != tuple(shp):
            raise SystemExit(f"peer_gguf: {n}: shape {written[n].shape}, expected {shp}")
        w.add_tensor(n, written[n])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def info(path):
    r = gguf.GGUFReader(path)
    per_bytes = per_w = 0
    types = {}
    for t in r.tensors:
        tn = t.tensor_type.name
        types[tn] = types.get(tn, 0) + 1
        n, b = int(t.n_elements), int(t.n_bytes)
        if t.name == "token_embd.weight":
            rows = int(t.shape[-1])
            n, b = n // rows, b // rows
        per_bytes += b
        per_w += n
    out = {"file": str(path), "file_bytes": Path(path).stat().st_size, "bytes_per_token": per_bytes,
           "weights_per_token": per_w, "bits_per_weight_read": 8.0 * per_bytes / per_w, "tensor_types": types}
    print(json.dumps(out))


def main(argv):
    if len(argv) == 3 and argv[1] == "info":
        info(argv[2])
        return 0
    if len(argv) < 4 or argv[1] not in ("synthetic", "checkpoint"):
        sys.stderr.write(__doc__)
        return 2
    if argv[1] == "synthetic":
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 1
        synthetic(argv[2], argv[3], seed)
    else:
        checkpoint(argv[2], argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
