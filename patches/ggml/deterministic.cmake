# llama-branch's change to the vendored ggml (docs/determinism.md), for the CPU backend's reference
# path (`use_ref`, which deterministic contexts turn on):
#   - ops.cpp: the reference flash attention made independent of the order of the KV cells, so a
#     branch's logits do not depend on where llama.cpp placed its cells (each row adds its cells
#     in an order given by their contents; fast: query tiles, f32 sums;
#     flash-attn-order-independent.inc);
#   - ggml-cpu.c: the reference mul_mat takes llamafile's sgemm for the weight types whose AVX2
#     sgemm computes every output element with the same instructions in the same order whatever
#     the tile shape, and the same as their one-row vec_dot (Q8_0, Q4_0, Q5_0 against Q8_0), so
#     a row's product does not depend on how many rows its decode has, and prompts and wide
#     decodes keep sgemm's speed;
#   - ggml-cpu.c and arch/x86/quants.c: the reference mul_mat takes Q4_K and Q6_K weights 4
#     columns at a time (kquant-cols.inc: the weight row unpacked once for 4 activation rows,
#     each column's arithmetic exactly the one-row vec_dot's), the remaining columns one by one.
#
# How it is applied: .cargo/config.toml sets CMAKE_PROJECT_ggml_INCLUDE to this file, which
# llama-cpp-sys-2 forwards to CMake, which includes it right after ggml's project() call. It
# writes patched copies of those two files (the kernel spliced in from
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
[==[// llama-branch: whether the reference path (use_ref) may take llamafile_sgemm for weights of this
// type and stay batch-invariant: sgemm must compute each output element with the same
// instructions in the same order whatever the tile it falls in, and the same as the one-row
// vec_dot (sgemm declines one column: that column goes through vec_dot). True on AVX2 (with FMA)
// of Q8_0, Q4_0 and Q5_0 against Q8_0: tinyBLAS_Q0_AVX's gemm<RM, RN>, gemm4xN and gemmMx4 and
// ggml_vec_dot_{q8_0,q4_0,q5_0}_q8_0 all accumulate, per element, one __m256
// fmadd(d_a * d_b, cvt(exact int32 sums of 4 adjacent byte products), acc) over the blocks in
// order, then the same 8-lane horizontal sum; tiles and threads only choose which elements go
// together. Not IQ4_NL: its vec_dot alternates two accumulators.
static bool ggml_mul_mat_sgemm_batch_invariant(enum ggml_type type) {
#if GGML_USE_LLAMAFILE && defined(__AVX2__) && defined(__FMA__) && (defined(__x86_64__) || defined(_M_X64))
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q5_0;
#else
    GGML_UNUSED(type);
    return false;
#endif
}

void ggml_compute_forward_mul_mat(
]==])
    llama_branch_replace(text "ggml-cpu/ggml-cpu.c" "the definition of ggml_compute_forward_mul_mat_one_chunk"
        "static void ggml_compute_forward_mul_mat_one_chunk(\n"
[==[// llama-branch: Q4_K and Q6_K dot products of one weight row with 4 columns, each column bitwise
// the one-row vec_dot's (arch/x86/quants.c, patches/ggml/kquant-cols.inc)
void ggml_vec_dot_q4_K_q8_K_cols4(int n, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, size_t by);
void ggml_vec_dot_q6_K_q8_K_cols4(int n, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, size_t by);

static void ggml_compute_forward_mul_mat_one_chunk(
]==])
    llama_branch_replace(text "ggml-cpu/ggml-cpu.c" "the block tiling of ggml_compute_forward_mul_mat_one_chunk"
        "    // attempt to reduce false-sharing (does not seem to make a difference)\n"
[==[#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))
    // llama-branch: the reference path takes Q4_K and Q6_K weights 4 columns at a time (the
    // weight row unpacked once for the 4), the remaining columns one by one; both compute each
    // element with the same arithmetic, so a row's product does not depend on its decode's rows
    if (params->use_ref && num_rows_per_vec_dot == 1 && (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K) &&
            ne12 == 1 && ne13 == 1 && (src1_cont || src1->type != vec_dot_type)) {
        void (*const cols4)(int, float *, const void *, const void *, size_t) =
            type == GGML_TYPE_Q4_K ? ggml_vec_dot_q4_K_q8_K_cols4 : ggml_vec_dot_q6_K_q8_K_cols4;
        const char * rows = (const char *) src0->data;
        for (int64_t iir1 = ir1_start; iir1 < ir1_end; iir1 += 16) {
            const int64_t end1 = MIN(iir1 + 16, ir1_end);
            for (int64_t iir0 = ir0_start; iir0 < ir0_end; iir0 += 16) {
                const int64_t end0 = MIN(iir0 + 16, ir0_end);
                int64_t ir1 = iir1;
                for (; ir1 + 4 <= end1; ir1 += 4) {
                    const char * cols = (const char *) wdata + ir1 * row_size;
                    for (int64_t ir0 = iir0; ir0 < end0; ++ir0) {
                        float out[4];
                        cols4(ne00, out, rows + ir0 * nb01, cols, row_size);
                        for (int c = 0; c < 4; ++c) {
                            ((float *) ((char *) dst->data + (ir1 + c) * nb1))[ir0] = out[c];
                        }
                    }
                }
                for (; ir1 < end1; ++ir1) {
                    const char * col = (const char *) wdata + ir1 * row_size;
                    float * dst_col = (float *) ((char *) dst->data + ir1 * nb1);
                    for (int64_t ir0 = iir0; ir0 < end0; ++ir0) {
                        vec_dot(ne00, &dst_col[ir0], 0, rows + ir0 * nb01, 0, col, 0, 1);
                    }
                }
            }
        }
        return;
    }
#endif

    // attempt to reduce false-sharing (does not seem to make a difference)
]==])
    llama_branch_write("ggml-cpu/ggml-cpu.c" "${text}")

    # arch/x86/quants.c (x86 builds only): the 4-column Q4_K and Q6_K kernels, appended
    if(EXISTS "${src}/ggml-cpu/arch/x86/quants.c")
        file(READ "${src}/ggml-cpu/arch/x86/quants.c" text)
        file(READ "${LLAMA_BRANCH_PATCH_DIR}/kquant-cols.inc" kernels)
        # the copy lives elsewhere: its includes relative to arch/x86/ made absolute
        foreach(header IN ITEMS "quants.h" "ggml-cpu-impl.h")
            llama_branch_replace(text "ggml-cpu/arch/x86/quants.c" "the include of ${header}"
                "#include \"../../${header}\"" "#include \"${src}/ggml-cpu/${header}\"")
        endforeach()
        llama_branch_write("ggml-cpu/arch/x86/quants.c" "${text}${kernels}")
        set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${LLAMA_BRANCH_PATCH_DIR}/kquant-cols.inc")
    endif()

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
        foreach(rel IN ITEMS "ggml-cpu/ops.cpp" "ggml-cpu/ggml-cpu.c" "ggml-cpu/arch/x86/quants.c")
            list(FIND sources "${rel}" i)
            if(i EQUAL -1)
                continue()
            endif()
            list(REMOVE_AT sources ${i})
            list(INSERT sources ${i} "${CMAKE_BINARY_DIR}/llama-branch-patched/${rel}")
            if(NOT rel MATCHES "/arch/")
                math(EXPR found "${found} + 1")
            endif()
        endforeach()
        if(found EQUAL 0)
            continue()
        endif()
        if(NOT found EQUAL 2)
            message(FATAL_ERROR "llama-branch: ${t} lists only ${found} of the 2 ggml-cpu sources this patch replaces")
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
