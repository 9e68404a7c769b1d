//! Errors of the runtime's numerical core, as values. Each message names the offending
//! values and says what to change.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The model is outside what this executor implements.
    #[error("model `{model}` is not supported by the CPU executor: {reason}")]
    UnsupportedModel { model: String, reason: String },

    /// The tensor-parallel size does not split the model evenly.
    #[error("tensor-parallel split: {0}")]
    TpSplit(String),

    /// A token id is outside the vocabulary.
    #[error(
        "token {token} at position {position} is outside the vocabulary of {vocab} ids; use a tokenizer or data set that matches model.vocab"
    )]
    TokenOutOfRange { token: u32, position: usize, vocab: usize },

    /// A batch does not have the shape the model or the trainer expects.
    #[error("batch shape: {0}")]
    BatchShape(String),

    /// The training data could not be loaded or does not fit the model.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),

    /// A training setting is out of range.
    #[error("training setting: {0}")]
    BadSetting(String),
}
