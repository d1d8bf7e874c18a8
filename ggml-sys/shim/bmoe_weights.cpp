// Where llama.cpp put a model's weights: the one question about them the public API (llama.h)
// cannot answer, since it lists no tensor. Compiled against llama.cpp's internal headers of the
// source tree the sys crate built, like bmoe_unlink.cpp, for `llama_internal_get_tensor_map`
// (llama-model.h), which llama.cpp itself exports for its tools.
#include <cstdint>
#include <cstring>

#include "ggml-backend.h"
#include "llama-model.h"

extern "C" {

// Counts the model's weight tensors whose buffer is of the buffer type named `buft_name` (e.g.
// "CPU_REPACK", the CPU's repacked layout) and their bytes in the file's layout (`ggml_nbytes`).
// Reads pointers and names only; touches no tensor data. Returns 0, or 1 when something threw
// (nothing is counted then).
int bmoe_model_weights_in(const llama_model * model, const char * buft_name, size_t * n_tensors,
                          uint64_t * n_bytes) noexcept {
    *n_tensors = 0;
    *n_bytes = 0;
    try {
        size_t n = 0;
        uint64_t bytes = 0;
        for (const auto & named : llama_internal_get_tensor_map(model)) {
            const ggml_tensor * t = named.second;
            if (t == nullptr || t->buffer == nullptr) {
                continue;
            }
            const char * name = ggml_backend_buft_name(ggml_backend_buffer_get_type(t->buffer));
            if (name != nullptr && std::strcmp(name, buft_name) == 0) {
                n++;
                bytes += ggml_nbytes(t);
            }
        }
        *n_tensors = n;
        *n_bytes = bytes;
        return 0;
    } catch (...) {
        return 1;
    }
}

} // extern "C"
