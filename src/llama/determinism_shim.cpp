// One switch llama.cpp's C API does not reach: the CPU backend's reference kernels
// (`ggml_backend_cpu_set_use_ref`) for the CPU backend a llama_context created for itself.
//
// With them every matrix product computes each output element with one vec_dot over the row,
// whatever the number of rows (no tiled K-quant kernels from 8 rows up, no llamafile sgemm), and
// flash attention runs every query row through the one-row kernel over the whole KV (no split of
// the KV across threads for a lone row, no query tiles): the result for one row no longer depends
// on the other rows of the decode or on the thread count. docs/determinism.md has the
// measurements.
//
// The context's scheduler is reached through `llama_context::get_sched()`, a public member of
// the class in llama.cpp's src/llama-context.h (compiled against the same tree that built
// libllama, so the layout agrees). The setter is looked up in the CPU backend's registry, as
// llama.cpp itself looks up `ggml_backend_set_n_threads`, so it also works where ggml-cpu is a
// dynamically loaded module. No C++ exception can leave this file.

#include "llama-context.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"

extern "C" {

// Status codes, named in src/llama/context.rs's error: 0 set on the context's CPU backend;
// 1 the context has no CPU backend (or an exception); 2 the CPU backend does not export the setter.
int lb_set_cpu_reference_kernels(llama_context * ctx, bool on) {
    try {
        ggml_backend_sched_t sched = ctx->get_sched();
        const int n = ggml_backend_sched_get_n_backends(sched);
        for (int i = 0; i < n; i++) {
            ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
            ggml_backend_dev_t dev = ggml_backend_get_device(backend);
            if (dev == nullptr || ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
                continue;
            }
            ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
            auto * set_use_ref = (decltype(ggml_backend_cpu_set_use_ref) *)
                ggml_backend_reg_get_proc_address(reg, "ggml_backend_cpu_set_use_ref");
            if (set_use_ref == nullptr) {
                return 2;
            }
            set_use_ref(backend, on);
            return 0;
        }
        return 1;
    } catch (...) {
        return 1;
    }
}

}  // extern "C"
