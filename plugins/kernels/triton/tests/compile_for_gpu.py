"""Compile every kernel for an H100/H200 (sm_90) down to a cubin, with no GPU present.

Run as a script (never under TRITON_INTERPRET): triton's bundled ptxas does the
whole pipeline on CPU, so shape rules of tl.dot, types in loops and early returns
are checked for the real backend. Prints one line per kernel variant.
"""

from __future__ import annotations

import os

import triton
from llmp_kernels_triton import activation, attention, kv_write, lora, quant_matmul, rms_norm, rotary
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

assert not os.environ.get("TRITON_INTERPRET"), "compile_for_gpu needs the compiler, not the interpreter"

TARGET = GPUTarget("cuda", 90, 32)


def build(fn, types: dict[str, str], consts: dict[str, object], num_warps: int = 4) -> None:
    signature = {name: "constexpr" if name in consts else types[name] for name in fn.arg_names}
    kernel = triton.compile(ASTSource(fn, signature, consts), target=TARGET, options=dict(num_warps=num_warps))
    assert kernel.asm["cubin"], fn.__name__
    print("ok", fn.__name__, consts)


def main() -> None:
    bf16, i32 = "*bf16", "i32"
    for dtype, window, softcap, f32, group, head_dim, block_m in (
        ("bf16", False, False, False, 2, 128, 16),  # Qwen3-0.6B decode
        ("fp16", True, True, False, 7, 64, 64),  # Qwen2.5-0.5B-style group of 7, prefill tiles, all options
        ("fp32", True, True, True, 4, 80, 16),  # float32 (exact dot) and a padded head size
    ):
        ptr = f"*{dtype}"
        types = dict(
            q_ptr=ptr,
            k_cache_ptr=ptr,
            v_cache_ptr=ptr,
            out_ptr=ptr,
            part_m_ptr="*fp32",
            part_l_ptr="*fp32",
            part_acc_ptr="*fp32",
            q_start_ptr="*i32",
            seq_lens_ptr="*i32",
            block_tables_ptr="*i32",
            n_requests=i32,
            n_kv_heads=i32,
            n_segments=i32,
            q_stride_t=i32,
            q_stride_h=i32,
            bt_stride=i32,
            scale="fp32",
            softcap="fp32",
            window=i32,
        )
        shapes = dict(GROUP=group, HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim))
        flags = dict(USE_WINDOW=window, USE_SOFTCAP=softcap, F32=f32)
        tiles = dict(BLOCK_SIZE=16, BLOCK_M=block_m, BLOCK_Q=block_m // group, TILE_N=64, SEG=attention.SEGMENT)
        for skip in (False, True):
            build(attention._paged_attention_kernel, types, dict(**shapes, **tiles, **flags, SKIP_DECODES=skip))
        build(attention._decode_segment_kernel, types, dict(**shapes, **tiles, **flags))
        merge = dict(BLOCK_M=max(16, triton.next_power_of_2(group)), SEG=attention.SEGMENT, USE_WINDOW=window)
        build(attention._decode_merge_kernel, types, dict(**shapes, **merge))
    norm_types = dict(
        x_ptr=bf16,
        res_ptr=bf16,
        w_ptr=bf16,
        out_ptr=bf16,
        sum_ptr=bf16,
        n_rows=i32,
        n_cols=i32,
        x_stride=i32,
        res_stride=i32,
        eps="fp32",
    )
    build(rms_norm._rms_norm_kernel, norm_types, dict(HAS_RESIDUAL=True, ROWS=2, BLOCK=1024))
    build(rms_norm._rms_norm_kernel, norm_types, dict(HAS_RESIDUAL=False, ROWS=16, BLOCK=128))
    build(
        rotary._rotary_kernel,
        dict(
            pos_ptr="*i64",
            q_ptr=bf16,
            k_ptr=bf16,
            q_out_ptr=bf16,
            k_out_ptr=bf16,
            cs_ptr="*fp32",
            n_q_heads=i32,
            n_k_heads=i32,
            q_stride_t=i32,
            q_stride_h=i32,
            k_stride_t=i32,
            k_stride_h=i32,
            cs_stride=i32,
        ),
        dict(HEAD_DIM=128, HALF=32, HALF_PAD=32, HQ_PAD=16, HK_PAD=8, PASS_PAD=64),
    )
    for gelu in (False, True):
        build(
            activation._gated_kernel, dict(x_ptr=bf16, out_ptr=bf16, d=i32, x_stride=i32), dict(GELU=gelu, BLOCK=1024)
        )
    build(
        kv_write._write_kv_kernel,
        dict(
            k_ptr=bf16,
            v_ptr=bf16,
            k_cache_ptr=bf16,
            v_cache_ptr=bf16,
            slot_ptr="*i64",
            n_heads=i32,
            k_stride_t=i32,
            k_stride_h=i32,
            v_stride_t=i32,
            v_stride_h=i32,
        ),
        dict(HEAD_DIM=128, H_PAD=8, D_PAD=128),
    )
    lora_types = dict(rows_ptr="*i64", starts_ptr="*i32", slots_ptr="*i32", rank=i32)
    build(  # qkv of rank 16: three shards side by side, R = 48
        lora._lora_shrink_kernel,
        dict(lora_types, x_ptr=bf16, a_ptr=bf16, s_ptr=bf16, n_in=i32, x_stride=i32, a_stride_l=i32, a_stride_r=i32),
        dict(BLOCK_M=lora.BLOCK_M, BLOCK_R=64, BLOCK_K=lora.BLOCK_K, F32=False),
    )
    build(
        lora._lora_expand_kernel,
        dict(lora_types, y_ptr=bf16, s_ptr=bf16, b_ptr=bf16, n_out=i32, y_stride=i32, b_stride_l=i32, b_stride_o=i32),
        dict(BLOCK_M=lora.BLOCK_M, BLOCK_R=16, BLOCK_N=lora.BLOCK_N, F32=False),
    )
    # quantised matmuls: every format with the decode tile (one row, bf16), and the prefill tile of a legacy
    # format and of a Q4_K_M file's two, in the other dtypes
    launches = [(name, "bf16", 1) for name in quant_matmul.FORMATS]
    launches += [("Q4_0", "fp16", 17), ("Q4_K", "bf16", 17), ("Q6_K", "fp32", 17)]
    for name, dtype, tokens in launches:
        ggml_type, block_size, type_size = quant_matmul.FORMATS[name]
        block_t, block_n, warps = quant_matmul.launch_config(tokens)
        build(
            quant_matmul._quant_matmul_kernel,
            dict(
                x_ptr=f"*{dtype}",
                w_ptr="*u8",
                out_ptr=f"*{dtype}",
                n_tokens=i32,
                n_out=i32,
                n_blocks=i32,
                x_stride=i32,
                w_stride=i32,
            ),
            dict(FMT=ggml_type, BLOCK_SIZE=block_size, TYPE_SIZE=type_size, BLOCK_T=block_t, BLOCK_N=block_n),
            num_warps=warps,
        )


if __name__ == "__main__":
    main()
