//! strata-runtime: a GPT trained for real under a plan.
