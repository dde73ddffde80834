#!/usr/bin/env python3
"""Writes a tiny multimodal projector (mmproj GGUF) with random weights, for the image tests.

Projector type `gemma3` (what llama.cpp's tools/mtmd loads for Gemma 3 vision): a SigLIP-style
ViT, an n x n average pool, RMS norm times `mm.soft_emb_norm`, then `mm.input_projection` into the
text model's embedding width. Weights are random (fixed seed), so the file exercises every code
path of loading, tokenizing, encoding and decoding an image, and nothing of quality.

    python3 make-mmproj.py OUT.gguf [--n-embd 640] [--seed 1]

Sizes (see /work/shared/spec/landscape-round5.md section 2): hidden 64, feed-forward 128 (it must
differ from the hidden size), 4 heads, 2 layers, image 128, patch 8, pool 4 ->
(128 / 8 / 4)^2 = 16 image tokens. Needs PyPI `gguf` (and numpy, which it brings).
"""
import argparse

import numpy as np
import gguf

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--n-embd", type=int, default=640, help="the text model's embedding width")
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()

H, F, HEADS, LAYERS, IMAGE, PATCH, SCALE = 64, 128, 4, 2, 128, 8, 4
N_PATCHES = (IMAGE // PATCH) ** 2
rng = np.random.default_rng(a.seed)


def rand(*shape, scale=0.05):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def ones(*shape):
    return np.ones(shape, dtype=np.float32)


def zeros(*shape):
    return np.zeros(shape, dtype=np.float32)


w = gguf.GGUFWriter(a.out, "clip")
w.add_string("general.name", "llama-branch test projector (random weights)")
w.add_string("clip.projector_type", "gemma3")
w.add_bool("clip.has_vision_encoder", True)
w.add_bool("clip.use_gelu", True)
w.add_uint32("clip.vision.image_size", IMAGE)
w.add_uint32("clip.vision.patch_size", PATCH)
w.add_uint32("clip.vision.embedding_length", H)
w.add_uint32("clip.vision.feed_forward_length", F)
w.add_uint32("clip.vision.block_count", LAYERS)
w.add_uint32("clip.vision.projection_dim", a.n_embd)
w.add_uint32("clip.vision.attention.head_count", HEADS)
w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
w.add_uint32("clip.vision.projector.scale_factor", SCALE)

# numpy shapes; ggml reverses them.
w.add_tensor("v.patch_embd.weight", rand(H, 3, PATCH, PATCH))
w.add_tensor("v.patch_embd.bias", zeros(H))
w.add_tensor("v.position_embd.weight", rand(N_PATCHES, H).astype(np.float32))
for i in range(LAYERS):
    for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
        w.add_tensor(f"v.blk.{i}.{t}.weight", rand(H, H))
        w.add_tensor(f"v.blk.{i}.{t}.bias", zeros(H))
    for t in ("ln1", "ln2"):
        w.add_tensor(f"v.blk.{i}.{t}.weight", ones(H))
        w.add_tensor(f"v.blk.{i}.{t}.bias", zeros(H))
    w.add_tensor(f"v.blk.{i}.ffn_up.weight", rand(F, H))
    w.add_tensor(f"v.blk.{i}.ffn_up.bias", zeros(F))
    w.add_tensor(f"v.blk.{i}.ffn_down.weight", rand(H, F))
    w.add_tensor(f"v.blk.{i}.ffn_down.bias", zeros(H))
w.add_tensor("v.post_ln.weight", ones(H))
w.add_tensor("v.post_ln.bias", zeros(H))
w.add_tensor("mm.soft_emb_norm.weight", ones(H))
w.add_tensor("mm.input_projection.weight", rand(H, a.n_embd, scale=0.5))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
