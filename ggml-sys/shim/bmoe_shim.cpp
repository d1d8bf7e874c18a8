// C++ exceptions must never unwind into Rust frames: Rust cannot catch a foreign exception and
// aborts the process ("Rust cannot catch foreign exceptions"). Every llama.cpp entry point the
// engine calls that can throw (a `throw`, a `.at()`, an allocation reachable from the C function
// without a `catch` on the way out) is called through one of these wrappers instead. Each wrapper
// catches everything and returns BMOE_OK or BMOE_THREW with the exception's message copied into
// the caller's buffer; results go through out-parameters.
//
// What is NOT caught here: GGML_ASSERT / GGML_ABORT (they call abort(), which no catch sees) and
// memory faults. Those are kept away by the engine's checks before a load and, for what cannot be
// checked first, isolated by the runner's probe in a child process.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>

#include "llama.h"

namespace {

constexpr int BMOE_OK = 0;
constexpr int BMOE_THREW = 1;

// Copies `msg` into `err` (NUL-terminated, truncated to `err_len`); `err` may be null.
void put_message(char * err, size_t err_len, const char * msg) {
    if (err == nullptr || err_len == 0) {
        return;
    }
    if (msg == nullptr) {
        msg = "unknown exception";
    }
    size_t n = std::strlen(msg);
    if (n >= err_len) {
        n = err_len - 1;
    }
    std::memcpy(err, msg, n);
    err[n] = '\0';
}

// Runs `f`, turning any exception into BMOE_THREW plus its message. Nothing in here may throw:
// put_message only copies bytes, and what() is noexcept.
template <typename F>
int guarded(char * err, size_t err_len, F && f) noexcept {
    try {
        f();
        return BMOE_OK;
    } catch (const std::bad_alloc &) {
        put_message(err, err_len, "out of memory (std::bad_alloc)");
    } catch (const std::exception & e) {
        put_message(err, err_len, e.what());
    } catch (...) {
        put_message(err, err_len, "a non-standard C++ exception");
    }
    return BMOE_THREW;
}

} // namespace

extern "C" {

int bmoe_model_load_from_file(const char * path, llama_model_params params, llama_model ** out,
                              char * err, size_t err_len) noexcept {
    *out = nullptr;
    return guarded(err, err_len, [&] { *out = llama_model_load_from_file(path, params); });
}

int bmoe_model_init_from_user(gguf_context * metadata, llama_model_set_tensor_data_t set_data,
                              void * set_data_ud, llama_model_params params, llama_model ** out,
                              char * err, size_t err_len) noexcept {
    *out = nullptr;
    return guarded(err, err_len, [&] {
        *out = llama_model_init_from_user(metadata, set_data, set_data_ud, params);
    });
}

int bmoe_init_from_model(llama_model * model, llama_context_params params, llama_context ** out,
                         char * err, size_t err_len) noexcept {
    *out = nullptr;
    return guarded(err, err_len, [&] { *out = llama_init_from_model(model, params); });
}

int bmoe_decode(llama_context * ctx, llama_batch batch, int32_t * out, char * err,
                size_t err_len) noexcept {
    return guarded(err, err_len, [&] { *out = llama_decode(ctx, batch); });
}

int bmoe_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len,
                  llama_token * tokens, int32_t n_tokens_max, bool add_special,
                  bool parse_special, int32_t * out, char * err, size_t err_len) noexcept {
    return guarded(err, err_len, [&] {
        *out = llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special,
                              parse_special);
    });
}

int bmoe_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf, int32_t length,
                        int32_t lstrip, bool special, int32_t * out, char * err,
                        size_t err_len) noexcept {
    return guarded(err, err_len, [&] {
        *out = llama_token_to_piece(vocab, token, buf, length, lstrip, special);
    });
}

int bmoe_chat_apply_template(const char * tmpl, const llama_chat_message * chat, size_t n_msg,
                             bool add_ass, char * buf, int32_t length, int32_t * out, char * err,
                             size_t err_len) noexcept {
    return guarded(err, err_len, [&] {
        *out = llama_chat_apply_template(tmpl, chat, n_msg, add_ass, buf, length);
    });
}

int bmoe_model_chat_template(const llama_model * model, const char ** out, char * err,
                             size_t err_len) noexcept {
    *out = nullptr;
    return guarded(err, err_len, [&] { *out = llama_model_chat_template(model, nullptr); });
}

// A whole sampler chain in one call, so a throw half way frees what was built: greedy when
// `greedy`, else top-k (k > 0), top-p (p < 1), temperature and a seeded draw.
int bmoe_sampler_chain_new(bool greedy, uint32_t seed, float temperature, int32_t top_k,
                           float top_p, llama_sampler ** out, char * err, size_t err_len) noexcept {
    *out = nullptr;
    llama_sampler * chain = nullptr;
    int rc = guarded(err, err_len, [&] {
        chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
        if (chain == nullptr) {
            return;
        }
        if (greedy) {
            llama_sampler_chain_add(chain, llama_sampler_init_greedy());
            return;
        }
        if (top_k > 0) {
            llama_sampler_chain_add(chain, llama_sampler_init_top_k(top_k));
        }
        if (top_p < 1.0f) {
            llama_sampler_chain_add(chain, llama_sampler_init_top_p(top_p, 1));
        }
        llama_sampler_chain_add(chain, llama_sampler_init_temp(temperature));
        llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
    });
    if (rc != BMOE_OK) {
        if (chain != nullptr) {
            // Freeing a chain frees the samplers added so far; a destructor that throws is caught.
            guarded(nullptr, 0, [&] { llama_sampler_free(chain); });
        }
        return rc;
    }
    *out = chain;
    return BMOE_OK;
}

int bmoe_sampler_sample(llama_sampler * smpl, llama_context * ctx, int32_t idx, llama_token * out,
                        char * err, size_t err_len) noexcept {
    return guarded(err, err_len, [&] { *out = llama_sampler_sample(smpl, ctx, idx); });
}

int bmoe_model_free(llama_model * model, char * err, size_t err_len) noexcept {
    return guarded(err, err_len, [&] { llama_model_free(model); });
}

int bmoe_free(llama_context * ctx, char * err, size_t err_len) noexcept {
    return guarded(err, err_len, [&] { llama_free(ctx); });
}

int bmoe_memory_clear(llama_context * ctx, char * err, size_t err_len) noexcept {
    return guarded(err, err_len, [&] { llama_memory_clear(llama_get_memory(ctx), true); });
}

// The sequence-state calls of prefix reuse. llama.cpp catches std::exception inside (not
// everything), and `synchronize()` and the io objects' allocation sit outside that catch.
int bmoe_state_seq_get_size(llama_context * ctx, llama_seq_id seq, size_t * out, char * err,
                            size_t err_len) noexcept {
    *out = 0;
    return guarded(err, err_len, [&] { *out = llama_state_seq_get_size(ctx, seq); });
}

int bmoe_state_seq_get_data(llama_context * ctx, uint8_t * dst, size_t size, llama_seq_id seq,
                            size_t * out, char * err, size_t err_len) noexcept {
    *out = 0;
    return guarded(err, err_len, [&] { *out = llama_state_seq_get_data(ctx, dst, size, seq); });
}

int bmoe_state_seq_set_data(llama_context * ctx, const uint8_t * src, size_t size,
                            llama_seq_id seq, size_t * out, char * err, size_t err_len) noexcept {
    *out = 0;
    return guarded(err, err_len, [&] { *out = llama_state_seq_set_data(ctx, src, size, seq); });
}

// Sequence edits of the memory (KV cells, recurrent states): the recurrent memory throws on
// cells it cannot find, and both use std containers that allocate.
int bmoe_memory_seq_rm(llama_context * ctx, llama_seq_id seq, llama_pos p0, llama_pos p1,
                       bool * out, char * err, size_t err_len) noexcept {
    *out = false;
    return guarded(err, err_len,
                   [&] { *out = llama_memory_seq_rm(llama_get_memory(ctx), seq, p0, p1); });
}

int bmoe_memory_seq_cp(llama_context * ctx, llama_seq_id src, llama_seq_id dst, llama_pos p0,
                       llama_pos p1, char * err, size_t err_len) noexcept {
    return guarded(err, err_len,
                   [&] { llama_memory_seq_cp(llama_get_memory(ctx), src, dst, p0, p1); });
}

// The control vector: it allocates a ggml context and backend buffers (std::vector, maps).
int bmoe_set_adapter_cvec(llama_context * ctx, const float * data, size_t len, int32_t n_embd,
                          int32_t il_start, int32_t il_end, int32_t * out, char * err,
                          size_t err_len) noexcept {
    *out = -1;
    return guarded(err, err_len, [&] {
        *out = llama_set_adapter_cvec(ctx, data, len, n_embd, il_start, il_end);
    });
}

// A test hook: throws a std::out_of_range through the same guard, so a test can see a C++
// exception come back as an error without needing a damaged model.
int bmoe_shim_selftest(char * err, size_t err_len) noexcept {
    return guarded(err, err_len, [&] {
        volatile bool always = true;
        if (always) {
            throw std::out_of_range("bmoe shim self-test");
        }
    });
}

} // extern "C"
