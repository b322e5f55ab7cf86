//! Who can fix a failure, and so the exit code: each layer's error type
//! says it of itself (`Classified`), per variant where a layer has both
//! kinds; `fault_of` asks the first classified error of a cause chain.
//! An error no layer classified (a broken invariant, a bug) is internal.

/// Who can fix a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Bad flags, config, data or files: exit code 1.
    User,
    /// A bug of this program: exit code 2.
    Internal,
}

impl Fault {
    pub fn exit_code(self) -> u8 {
        match self {
            Fault::User => 1,
            Fault::Internal => 2,
        }
    }
}

/// A layer's error that knows who can fix it.
pub trait Classified: std::error::Error + 'static {
    fn fault(&self) -> Fault;
}

impl Classified for std::io::Error {
    /// A file or socket the user named could not be used.
    fn fault(&self) -> Fault {
        Fault::User
    }
}

/// Asks `e` for its fault if its type is one of the layers' error types.
/// Each layer has one error type (or one per kind of failure it reports
/// apart); a new layer's type is added here once.
fn classify(e: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    macro_rules! layers {
        ($($t:ty),* $(,)?) => {
            $(if let Some(x) = e.downcast_ref::<$t>() {
                return Some(x.fault());
            })*
        };
    }
    layers!(
        crate::cli::UserError,
        crate::cli::UserFault,
        crate::config::ConfigError,
        crate::data::DataError,
        crate::features::EncodeError,
        crate::checkpoint::Unusable,
        crate::train::step::Diverged,
        crate::dist::Disagreement,
        crate::serve::ServeError,
        crate::output::OutputError,
        crate::predict::PredictError,
        std::io::Error,
    );
    None
}

/// The fault of the outermost classified error of `err`'s cause chain:
/// a layer that wraps a cause decides for it.
pub fn fault_of(err: &anyhow::Error) -> Fault {
    err.chain().find_map(classify).unwrap_or(Fault::Internal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn the_outermost_classified_cause_decides_and_unclassified_is_internal() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let wrapped = Err::<(), _>(io).context("reading x").context("loading y").unwrap_err();
        assert_eq!(fault_of(&wrapped), Fault::User);
        assert_eq!(fault_of(&anyhow::anyhow!("index out of range")), Fault::Internal);
        let data = anyhow::Error::from(crate::data::DataError::NoFiles("*.csv".into())).context("train input");
        assert_eq!(fault_of(&data).exit_code(), 1);
    }
}
