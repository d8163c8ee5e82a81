//! Label and field selectors: parsing (with the real server's error wording) and matching.
//!
//! Start at [`Selectors::parse`], which turns the `labelSelector` and
//! `fieldSelector` query parameters of a request into one predicate.

mod field;
mod label;

pub use field::FieldSelector;
pub use label::LabelSelector;

use serde_json::Value;

use crate::resources::ResourceInfo;

/// A selector string that does not parse; its text is the real server's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Error(pub String);

/// Result with the selector [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The label and field selectors of one request.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Parses both selectors for `res`.
    pub fn parse(res: &ResourceInfo, labels: Option<&str>, fields: Option<&str>) -> Result<Self> {
        Ok(Selectors {
            labels: LabelSelector::parse(labels.unwrap_or(""))?,
            fields: FieldSelector::parse(res, fields.unwrap_or(""))?,
        })
    }

    /// Whether neither selector restricts anything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether `obj` is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}
