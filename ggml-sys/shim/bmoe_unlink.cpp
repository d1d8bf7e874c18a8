// Unlinks optional tensors a model built from a header alone (`llama_model_init_from_user`)
// created although the file does not hold them, so that the graph builders skip their ops exactly
// as after llama.cpp's own load of the file (`if (layer.bq) Qcur = ggml_add(..)`).
//
// `llama_model_init_from_user` creates every optional tensor (llama-model-loader.cpp, the
// `files.empty()` branch of `create_tensor`), and the public API offers no way to drop one. Bound
// to neutral values (zeros, ones) they compute the same result, but as extra graph nodes: about a
// quarter more nodes per token for qwen3moe, each a barrier for the compute threads. This file is
// compiled against llama.cpp's internal headers of the very source tree the sys crate built
// (found by build.rs from that build's CMakeCache), so the structures' layouts are the ones the
// libraries were compiled with.
//
// `llama_layer` is, in this tree, an aggregate of `ggml_tensor *` members only (nested structs of
// them included). The scan below reads it as pointer slots, and refuses to change anything unless
// every non-null slot of every layer holds a pointer to one of the model's own tensors: a
// non-pointer member added by another llama.cpp version makes it decline, never write.
#include <cstddef>
#include <cstring>
#include <exception>
#include <type_traits>
#include <unordered_set>

#include "llama-model.h"

static_assert(std::is_standard_layout<llama_layer>::value, "llama_layer is not standard layout");
static_assert(std::is_trivially_copyable<llama_layer>::value, "llama_layer is not trivially copyable");
static_assert(sizeof(llama_layer) % sizeof(ggml_tensor *) == 0,
              "llama_layer is not a whole number of pointer slots");

namespace {

constexpr int UNLINK_OK = 0;
constexpr int UNLINK_DECLINED = 2;

// The model-level tensor members of `llama_model` (llama-model.h). A member renamed or removed by
// another llama.cpp version fails the build here instead of being missed.
ggml_tensor * llama_model::* const MODEL_TENSORS[] = {
    &llama_model::tok_embd, &llama_model::type_embd, &llama_model::pos_embd,
    &llama_model::tok_norm, &llama_model::tok_norm_b, &llama_model::output_norm,
    &llama_model::output_res_score, &llama_model::output_norm_b, &llama_model::output,
    &llama_model::output_b, &llama_model::output_norm_enc, &llama_model::output_s,
    &llama_model::output_in_s, &llama_model::nextn_proj_pre, &llama_model::nextn_proj_post,
    &llama_model::hrm_z_l_init, &llama_model::hc_head_fn, &llama_model::hc_head_base,
    &llama_model::hc_head_scale, &llama_model::cls, &llama_model::cls_b, &llama_model::cls_out,
    &llama_model::cls_out_b, &llama_model::cls_norm, &llama_model::cls_norm_b,
    &llama_model::conv1d, &llama_model::conv1d_b, &llama_model::altup_proj,
    &llama_model::altup_unembd_proj, &llama_model::per_layer_tok_embd, &llama_model::hc_head_norm,
    &llama_model::hc_head_down, &llama_model::hc_head_up, &llama_model::per_layer_model_proj,
    &llama_model::per_layer_proj_norm, &llama_model::fc, &llama_model::fc_s, &llama_model::d2t,
    &llama_model::dspark_markov_w1, &llama_model::dspark_markov_w2,
    &llama_model::dspark_markov_w2_s, &llama_model::dspark_conf_proj,
    &llama_model::dspark_conf_proj_b, &llama_model::dflash_selector_prev,
    &llama_model::dflash_selector_next, &llama_model::dflash_selector_hidden,
};

constexpr size_t SLOTS = sizeof(llama_layer) / sizeof(ggml_tensor *);

// Slot `i` of `layer`, read through memcpy (no aliasing of the struct as an array).
ggml_tensor * slot(const llama_layer & layer, size_t i) {
    ggml_tensor * p;
    std::memcpy(&p, reinterpret_cast<const unsigned char *>(&layer) + i * sizeof p, sizeof p);
    return p;
}

void clear_slot(llama_layer & layer, size_t i) {
    ggml_tensor * p = nullptr;
    std::memcpy(reinterpret_cast<unsigned char *>(&layer) + i * sizeof p, &p, sizeof p);
}

} // namespace

extern "C" {

// Clears every reference the model's layers and its model-level members hold to one of the
// `n_absent` tensors of `absent`; `*n_unlinked` counts the references cleared. Returns UNLINK_OK,
// or UNLINK_DECLINED with nothing changed when a layer slot holds something that is not one of the
// model's tensors or an `absent` tensor is not the model's. Touches no tensor data.
int bmoe_model_unlink_absent(llama_model * model, ggml_tensor * const * absent, size_t n_absent,
                             size_t * n_unlinked) noexcept {
    *n_unlinked = 0;
    try {
        std::unordered_set<const ggml_tensor *> known;
        for (const auto & named : model->tensors_by_name) {
            known.insert(named.second);
        }
        std::unordered_set<const ggml_tensor *> gone(absent, absent + n_absent);
        for (const ggml_tensor * t : gone) {
            if (known.count(t) == 0) {
                return UNLINK_DECLINED;
            }
        }
        for (const llama_layer & layer : model->layers) {
            for (size_t i = 0; i < SLOTS; i++) {
                const ggml_tensor * p = slot(layer, i);
                if (p != nullptr && known.count(p) == 0) {
                    return UNLINK_DECLINED;
                }
            }
        }
        size_t n = 0;
        for (llama_layer & layer : model->layers) {
            for (size_t i = 0; i < SLOTS; i++) {
                if (gone.count(slot(layer, i)) != 0) {
                    clear_slot(layer, i);
                    n++;
                }
            }
        }
        for (auto member : MODEL_TENSORS) {
            ggml_tensor *& p = model->*member;
            if (p != nullptr && gone.count(p) != 0) {
                p = nullptr;
                n++;
            }
        }
        *n_unlinked = n;
        return UNLINK_OK;
    } catch (...) {
        // Only the sets' allocations can throw, before anything is changed.
        return UNLINK_DECLINED;
    }
}

} // extern "C"
