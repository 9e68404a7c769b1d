//! Tests of the export writers.
