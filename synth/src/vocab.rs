//! The byte-level "llama" (SentencePiece) vocabulary of synthetic models: `<unk>`, `<s>`, `</s>`
//! and the 256 byte tokens, no space prefix, so every byte is its own token and `A`/`B`/`C` are
//! distinct first tokens.
use bmoe_engine::gguf::write::GgufBuilder;

/// Tokens in the synthetic vocabulary.
pub(crate) const N_VOCAB: usize = 3 + 256;

/// A ChatML-style template llama.cpp recognises (`<|im_start|>`).
pub(crate) const CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

pub(crate) fn write(g: &mut GgufBuilder) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    tokens.extend((0..=255u32).map(|b| format!("<0x{b:02X}>")));
    let scores = vec![0.0f32; N_VOCAB];
    let mut types = vec![2i32, 3, 3];
    types.extend(std::iter::repeat_n(6i32, 256));
    g.set_str("tokenizer.ggml.model", "llama");
    g.set_str_array("tokenizer.ggml.tokens", &tokens);
    g.set_f32_array("tokenizer.ggml.scores", &scores);
    g.set_i32_array("tokenizer.ggml.token_type", &types);
    g.set_u32("tokenizer.ggml.unknown_token_id", 0);
    g.set_u32("tokenizer.ggml.bos_token_id", 1);
    g.set_u32("tokenizer.ggml.eos_token_id", 2);
    g.set_bool("tokenizer.ggml.add_bos_token", true);
    g.set_bool("tokenizer.ggml.add_eos_token", false);
    g.set_bool("tokenizer.ggml.add_space_prefix", false);
    g.set_str("tokenizer.chat_template", CHAT_TEMPLATE);
}
