//! Accounting.
