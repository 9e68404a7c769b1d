//! Reproduces the AWS EFA `nic_efficiency` of the `aws-p4d` cluster preset from nccl-tests
//! all-reduce bus bandwidths measured on p4d nodes (sim/data/nic_nccl_tests.csv): the fitted
//! efficiency, then each row's measured and simulated busbw and the residual.
//!
//! `cargo run --release -p strata-sim --example fit_efa`

fn main() {
    use strata_sim::net::nic_fit;
    let rows = match nic_fit::rows(nic_fit::NIC_NCCL_TESTS_CSV) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: sim/data/nic_nccl_tests.csv: {e}");
            std::process::exit(2);
        }
    };
    match nic_fit::fit(&rows) {
        Ok(f) => print!("{}", nic_fit::report(&f)),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
