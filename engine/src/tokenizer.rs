//! A model's tokenizer without its weights, to check a job's decisions before anything loads:
//! a choice that adds no token to its prompt cannot be scored, and `bmoe check` says so.
use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};
use crate::ffi::tokenizer::VocabModel;
use crate::options::{DecideRequest, Scoring};
use crate::session::decide::tokenize_choice;

/// The vocabulary and chat template of a GGUF model (loaded with `vocab_only`: no tensor is read).
pub struct Tokenizer {
    raw: VocabModel,
    template: Option<String>,
    path: PathBuf,
}

impl Tokenizer {
    /// Loads the vocabulary of `path`, after the same header checks as `Model::load` (what
    /// llama.cpp would assert on, a duplicated token for one, is refused here with a reason).
    pub fn load(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(EngineError::ModelMissing { path: path.into() });
        }
        let index = crate::gguf::index::GgufIndex::open(path)?;
        crate::gguf::check::check(path, index.header())?;
        let raw = VocabModel::load(path).map_err(|reason| EngineError::ModelLoad {
            path: path.into(),
            reason: reason.to_string(),
        })?;
        let template = raw.chat_template();
        Ok(Self {
            raw,
            template,
            path: path.into(),
        })
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The prompt text `Session::decide` feeds for `req`: `prefix + suffix`, rendered as one user
    /// message unless `raw`.
    pub fn prompt_text(&self, req: &DecideRequest) -> Result<String> {
        let user = format!("{}{}", req.prefix, req.suffix);
        if user.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if req.raw {
            return Ok(user);
        }
        crate::chat::render_user_message(self.template.as_deref(), &user)
    }

    /// The choices of `req` that add no token to its prompt under `req.scoring` (each as the
    /// `EmptyChoice` error `Session::decide` would return), tokenized exactly as the decision
    /// will be. Colliding first tokens are [`Tokenizer::colliding_choices`]; a prompt longer
    /// than the context depends on the run and is left to it.
    pub fn empty_choices(&self, req: &DecideRequest) -> Result<Vec<EngineError>> {
        let text = self.prompt_text(req)?;
        let vocab = self.raw.vocab();
        let ctx_len = vocab
            .tokenize(&text, true, true)
            .map_err(EngineError::Tokenize)?
            .len();
        let mut out = Vec::new();
        for (i, c) in req.choices.iter().enumerate() {
            match tokenize_choice(vocab, req.scoring, &text, ctx_len, i, c) {
                Ok(_) => {}
                Err(e @ EngineError::EmptyChoice { .. }) => out.push(e),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Under `first_token` scoring, each choice of `req` whose first token is that of an earlier
    /// choice (as the `CollidingChoices` error `Session::decide` would return for the first such
    /// pair); none under the other scorings. Empty choices are [`Tokenizer::empty_choices`].
    pub fn colliding_choices(&self, req: &DecideRequest) -> Result<Vec<EngineError>> {
        if req.scoring != Scoring::FirstToken {
            return Ok(Vec::new());
        }
        let vocab = self.raw.vocab();
        let mut firsts: Vec<(usize, i32)> = Vec::new();
        let mut out = Vec::new();
        for (i, c) in req.choices.iter().enumerate() {
            let toks = vocab
                .tokenize(c, false, false)
                .map_err(EngineError::Tokenize)?;
            let Some(&first) = toks.first() else {
                continue;
            };
            match firsts.iter().find(|(_, t)| *t == first) {
                Some(&(j, _)) => out.push(EngineError::CollidingChoices {
                    first: j,
                    first_text: req.choices[j].clone(),
                    second: i,
                    second_text: c.clone(),
                    token: first,
                }),
                None => firsts.push((i, first)),
            }
        }
        Ok(out)
    }
}
