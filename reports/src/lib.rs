//! strata-reports: CSV, traces, plots and the HTML report.
