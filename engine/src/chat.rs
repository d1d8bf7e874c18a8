//! Chat templates: one user message rendered the way a model's template asks.
use crate::error::Result;

/// Renders `user` as one user message with `template`, reasoning off where the template has a
/// thinking block (as Qwen3's own template does with enable_thinking=false); the text unchanged
/// without a usable template. `Model::render_user_message` and the check's tokenizer both use it,
/// so a check tokenizes exactly as the run will.
pub(crate) fn render_user_message(template: Option<&str>, user: &str) -> Result<String> {
    let Some(t) = template else {
        return Ok(user.to_string());
    };
    Ok(match crate::ffi::model::apply_chat_template(t, user)? {
        Some(mut s) => {
            if t.contains("<think>") && !s.trim_end().ends_with("</think>") {
                s.push_str("<think>\n\n</think>\n\n");
            }
            s
        }
        None => user.to_string(),
    })
}
