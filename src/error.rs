//! Who can fix a failure, and so the exit code: each layer's error type
//! says it of itself (`Classified`), per variant where a layer has both
//! kinds. This file imports nothing of the crate (every layer imports it);
//! `cli::fault_of`, at the top, asks a cause chain's outermost classified
//! error, and an error no layer classified (a broken invariant, a bug) is
//! internal.

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
