# llama-branch's change to the vendored ggml (docs/determinism.md), for the CPU backend's reference
# path (`use_ref`, which deterministic contexts turn on):
#   - ops.cpp: the reference flash attention made independent of the order of the KV cells, so a
#     branch's logits do not depend on where llama.cpp placed its cells (and fast: query tiles,
#     vectorized fixed-point sums; flash-attn-order-independent.inc);
#   - ggml-cpu.c, llamafile/sgemm.cpp: the reference mul_mat takes llamafile's sgemm for the
#     weight types whose AVX2 kernel computes every output element with the same instructions in
#     the same order whatever the tile shape (Q8_0, Q4_0, Q5_0, IQ4_NL against Q8_0), for one
#     column too, so a row's product does not depend on how many rows its decode has.
#
# How it is applied: .cargo/config.toml sets CMAKE_PROJECT_ggml_INCLUDE to this file, which
# llama-cpp-sys-2 forwards to CMake, which includes it right after ggml's project() call. It
# writes patched copies of those three files (the kernel spliced in from
# flash-attn-order-independent.inc beside this file) into the build directory, and swaps the
# copies into every ggml-cpu target once they exist (a deferred call at the end of ggml's
# directory). The crate's sources in the cargo registry are never touched. If an update of
# llama.cpp moves the anchors, the configure step fails here, saying which one.

set(LLAMA_BRANCH_PATCH_DIR "${CMAKE_CURRENT_LIST_DIR}")

# replaces the one occurrence of `from` in the variable named by `var` by `to`; fails saying which
# file and what when the anchor is gone (a llama.cpp update moved it)
function(llama_branch_replace var file what from to)
    string(FIND "${${var}}" "${from}" at)
    if(at EQUAL -1)
        message(FATAL_ERROR "llama-branch: ${file} no longer has ${what} this patch replaces")
    endif()
    string(REPLACE "${from}" "${to}" text "${${var}}")
    set(${var} "${text}" PARENT_SCOPE)
endfunction()

# writes `text` as the patched copy of ggml/src/<rel>, only when it changes (a reconfigure does not
# rebuild ggml-cpu)
function(llama_branch_write rel text)
    set(patched "${CMAKE_BINARY_DIR}/llama-branch-patched/${rel}")
    file(WRITE "${patched}.tmp" "${text}")
    file(COPY_FILE "${patched}.tmp" "${patched}" ONLY_IF_DIFFERENT)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/src/${rel}")
endfunction()

function(llama_branch_patch_ggml_cpu)
    set(src "${CMAKE_CURRENT_SOURCE_DIR}/src")

    # ops.cpp: the order-independent kernel, before the function that dispatches to it, and the
    # dispatch: the reference path takes it
    file(READ "${src}/ggml-cpu/ops.cpp" text)
    set(call "                ggml_compute_forward_flash_attn_ext_f16_one_chunk(params, dst, ir0, ir1, 0, nek1, nullptr, 0);")
    llama_branch_replace(text "ggml-cpu/ops.cpp" "the flash-attention call" "${call}"
        "                if (use_ref) {\n                    ggml_compute_forward_flash_attn_ext_f16_order_independent(params, dst, ir0, ir1);\n                } else {\n    ${call}\n                }")
    set(anchor "static void ggml_compute_forward_flash_attn_ext_f16(\n")
    file(READ "${LLAMA_BRANCH_PATCH_DIR}/flash-attn-order-independent.inc" kernel)
    llama_branch_replace(text "ggml-cpu/ops.cpp" "the definition of ggml_compute_forward_flash_attn_ext_f16" "${anchor}" "${kernel}\n${anchor}")
    llama_branch_write("ggml-cpu/ops.cpp" "${text}")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${LLAMA_BRANCH_PATCH_DIR}/flash-attn-order-independent.inc")

    # ggml-cpu.c: the reference mul_mat takes sgemm where sgemm is batch-invariant
    file(READ "${src}/ggml-cpu/ggml-cpu.c" text)
    llama_branch_replace(text "ggml-cpu/ggml-cpu.c" "the sgemm call after the conversion of src1"
        "    if (!params->use_ref && src1->type != vec_dot_type) {\n        const void* wdata"
        "    if ((!params->use_ref || ggml_mul_mat_sgemm_batch_invariant(src0->type)) && src1->type != vec_dot_type) {\n        const void* wdata")
    llama_branch_replace(text "ggml-cpu/ggml-cpu.c" "the definition of ggml_compute_forward_mul_mat"
        "void ggml_compute_forward_mul_mat(\n"
[==[// llama-branch: whether llamafile_sgemm computes each output element of a product of this weight
// type (against Q8_0) with the same instructions in the same order whatever the tile it falls in
// and whatever the number of columns: then the reference path (use_ref) may take it and stay
// batch-invariant. True of tinyBLAS_Q0_AVX on AVX2: gemm<RM, RN>, gemm4xN and gemmMx4 all
// accumulate, per element, madd(d_a * d_b, updot(a, b), acc) over the blocks in order and end
// with hsum; tiles and threads only choose which elements go together. With use_ref it is also
// called for one column (llamafile/sgemm.cpp), so a row decoded alone gets the same bits.
static bool ggml_mul_mat_sgemm_batch_invariant(enum ggml_type type) {
#if GGML_USE_LLAMAFILE && defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_IQ4_NL;
#else
    GGML_UNUSED(type);
    return false;
#endif
}

void ggml_compute_forward_mul_mat(
]==])
    llama_branch_write("ggml-cpu/ggml-cpu.c" "${text}")

    # llamafile/sgemm.cpp: one column too on the reference path (the caller decides which types)
    file(READ "${src}/ggml-cpu/llamafile/sgemm.cpp" text)
    llama_branch_replace(text "ggml-cpu/llamafile/sgemm.cpp" "its include of sgemm.h"
        "#include \"sgemm.h\"\n" "#include \"llamafile/sgemm.h\"\n")
    llama_branch_replace(text "ggml-cpu/llamafile/sgemm.cpp" "the one-column check"
        "    if (n < 2)\n        return false;\n"
        "    if (n < 2 && !params->use_ref) // llama-branch: see ggml_mul_mat_sgemm_batch_invariant\n        return false;\n")
    llama_branch_write("ggml-cpu/llamafile/sgemm.cpp" "${text}")

    # the CPU targets are made in ggml/src or in ggml/src/ggml-cpu, depending on the build
    set(targets "")
    set(dirs "${src}")
    get_property(subdirs DIRECTORY "${src}" PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
    foreach(dir IN LISTS dirs)
        get_property(dir_targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
        list(APPEND targets ${dir_targets})
    endforeach()
    set(swapped 0)
    foreach(t IN LISTS targets)
        if(NOT t MATCHES "^ggml-cpu")
            continue()
        endif()
        get_target_property(sources ${t} SOURCES)
        if(NOT sources)
            continue()
        endif()
        set(found 0)
        foreach(rel IN ITEMS "ggml-cpu/ops.cpp" "ggml-cpu/ggml-cpu.c" "ggml-cpu/llamafile/sgemm.cpp")
            list(FIND sources "${rel}" i)
            if(i EQUAL -1)
                continue()
            endif()
            list(REMOVE_AT sources ${i})
            list(INSERT sources ${i} "${CMAKE_BINARY_DIR}/llama-branch-patched/${rel}")
            math(EXPR found "${found} + 1")
        endforeach()
        if(found EQUAL 0)
            continue()
        endif()
        if(NOT found EQUAL 3)
            message(FATAL_ERROR "llama-branch: ${t} lists only ${found} of the 3 ggml-cpu sources this patch replaces")
        endif()
        set_property(TARGET ${t} PROPERTY SOURCES "${sources}")
        math(EXPR swapped "${swapped} + 1")
    endforeach()
    if(swapped EQUAL 0)
        message(FATAL_ERROR "llama-branch: no ggml-cpu target lists ggml-cpu/ops.cpp to patch")
    endif()
    message(STATUS "llama-branch: deterministic reference kernels patched into ${swapped} ggml-cpu target(s)")
endfunction()

cmake_language(DEFER CALL llama_branch_patch_ggml_cpu)
