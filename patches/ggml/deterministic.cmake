# llama-branch's one change to the vendored ggml (docs/determinism.md): the CPU backend's
# reference flash attention (`use_ref`, which deterministic contexts turn on) made independent of
# the order of the KV cells, so a branch's logits do not depend on where llama.cpp placed its
# cells.
#
# How it is applied: .cargo/config.toml sets CMAKE_PROJECT_ggml_INCLUDE to this file, which
# llama-cpp-sys-2 forwards to CMake, which includes it right after ggml's project() call. It
# writes a copy of ggml-cpu/ops.cpp with the new kernel spliced in (from
# flash-attn-order-independent.inc beside this file) into the build directory, and swaps that
# copy into every ggml-cpu target once they exist (a deferred call at the end of ggml's
# directory). The crate's sources in the cargo registry are never touched. If an update of
# llama.cpp moves the anchors, the configure step fails here, saying which one.

set(LLAMA_BRANCH_PATCH_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(llama_branch_patch_ggml_cpu)
    set(original "${CMAKE_CURRENT_SOURCE_DIR}/src/ggml-cpu/ops.cpp")
    set(patched "${CMAKE_BINARY_DIR}/llama-branch-patched/ggml-cpu/ops.cpp")
    file(READ "${original}" text)

    # the dispatch: the reference path takes the order-independent kernel
    set(call "                ggml_compute_forward_flash_attn_ext_f16_one_chunk(params, dst, ir0, ir1, 0, nek1, nullptr, 0);")
    string(FIND "${text}" "${call}" at)
    if(at EQUAL -1)
        message(FATAL_ERROR "llama-branch: ${original} no longer has the flash-attention call this patch replaces")
    endif()
    string(REPLACE "${call}"
        "                if (use_ref) {\n                    ggml_compute_forward_flash_attn_ext_f16_order_independent(params, dst, ir0, ir1);\n                } else {\n    ${call}\n                }"
        text "${text}")

    # the kernel, before the function that dispatches to it
    set(anchor "static void ggml_compute_forward_flash_attn_ext_f16(\n")
    string(FIND "${text}" "${anchor}" at)
    if(at EQUAL -1)
        message(FATAL_ERROR "llama-branch: ${original} no longer defines ggml_compute_forward_flash_attn_ext_f16")
    endif()
    file(READ "${LLAMA_BRANCH_PATCH_DIR}/flash-attn-order-independent.inc" kernel)
    string(REPLACE "${anchor}" "${kernel}\n${anchor}" text "${text}")

    file(WRITE "${patched}.tmp" "${text}")
    # rewritten only when it changes, so a reconfigure does not rebuild ggml-cpu
    file(COPY_FILE "${patched}.tmp" "${patched}" ONLY_IF_DIFFERENT)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
        "${original}" "${LLAMA_BRANCH_PATCH_DIR}/flash-attn-order-independent.inc")

    # the CPU targets are made in ggml/src or in ggml/src/ggml-cpu, depending on the build
    set(targets "")
    set(dirs "${CMAKE_CURRENT_SOURCE_DIR}/src")
    get_property(subdirs DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/src" PROPERTY SUBDIRECTORIES)
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
        list(FIND sources "ggml-cpu/ops.cpp" i)
        if(i EQUAL -1)
            continue()
        endif()
        list(REMOVE_AT sources ${i})
        list(INSERT sources ${i} "${patched}")
        set_property(TARGET ${t} PROPERTY SOURCES "${sources}")
        math(EXPR swapped "${swapped} + 1")
    endforeach()
    if(swapped EQUAL 0)
        message(FATAL_ERROR "llama-branch: no ggml-cpu target lists ggml-cpu/ops.cpp to patch")
    endif()
    message(STATUS "llama-branch: order-independent reference flash attention in ${swapped} ggml-cpu target(s)")
endfunction()

cmake_language(DEFER CALL llama_branch_patch_ggml_cpu)
