//! Primitive costs of each mls-rs crypto provider and cipher suite.
//!
//! Run with `cargo run --release -p svc-crypto-bench`. Prints a table of
//! operations per second (median of several rounds) so that the engine's
//! default provider and cipher suite are chosen by measurement.

use std::time::{Duration, Instant};

use mls_rs_core::crypto::{CipherSuite, CipherSuiteProvider, CryptoProvider};

const ROUNDS: usize = 5;
const ROUND_TIME: Duration = Duration::from_millis(300);

/// Runs `op` repeatedly for ROUND_TIME, ROUNDS times; returns the median ops/s.
fn rate(mut op: impl FnMut()) -> f64 {
    let mut rates: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < ROUND_TIME {
                for _ in 0..16 {
                    op();
                }
                n += 16;
            }
            n as f64 / start.elapsed().as_secs_f64()
        })
        .collect();
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rates[ROUNDS / 2]
}

fn measure<P: CryptoProvider>(name: &str, provider: &P, suite: CipherSuite) {
    let Some(cs) = provider.cipher_suite_provider(suite) else {
        println!("| {name:<10} | {:>5} | unsupported |", u16::from(suite));
        return;
    };
    let (sk, pk) = cs.signature_key_generate().expect("keygen");
    let msg = vec![7u8; 256];
    let sig = cs.sign(&sk, &msg).expect("sign");
    let key = vec![1u8; cs.aead_key_size()];
    let nonce = vec![2u8; cs.aead_nonce_size()];
    let small = vec![3u8; 256];
    let large = vec![3u8; 16 * 1024];
    let sealed_small = cs.aead_seal(&key, &small, None, &nonce).unwrap();
    let sealed_large = cs.aead_seal(&key, &large, None, &nonce).unwrap();

    let sign = rate(|| {
        cs.sign(&sk, &msg).unwrap();
    });
    let verify = rate(|| {
        cs.verify(&pk, &sig, &msg).unwrap();
    });
    let seal_small = rate(|| {
        cs.aead_seal(&key, &small, None, &nonce).unwrap();
    });
    let open_small = rate(|| {
        cs.aead_open(&key, &sealed_small, None, &nonce).unwrap();
    });
    let open_large = rate(|| {
        cs.aead_open(&key, &sealed_large, None, &nonce).unwrap();
    });
    let hpke_kem = rate(|| {
        cs.kem_generate().unwrap();
    });
    println!(
        "| {name:<10} | {:>5} | {sign:>10.0} | {verify:>10.0} | {seal_small:>12.0} | {open_small:>12.0} | {open_large:>12.0} | {:>10.1} | {hpke_kem:>10.0} |",
        u16::from(suite),
        open_large * 16.0 * 1024.0 / 1e9,
    );
}

fn main() {
    println!("Primitive rates on one core, median of {ROUNDS} rounds (ops/s).");
    println!("suite 1 = MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519, suite 2 = MLS_128_DHKEMP256_AES128GCM_SHA256_P256\n");
    println!("| provider   | suite |    sign/s  |  verify/s  | seal 256B/s  | open 256B/s  | open 16KiB/s | open GB/s  |  kem gen/s |");
    println!("|------------|-------|------------|------------|--------------|--------------|--------------|------------|------------|");
    for suite in [CipherSuite::CURVE25519_AES128, CipherSuite::P256_AES128] {
        measure("openssl", &mls_rs_crypto_openssl::OpensslCryptoProvider::default(), suite);
        measure("awslc", &mls_rs_crypto_awslc::AwsLcCryptoProvider::default(), suite);
        measure("rustcrypto", &mls_rs_crypto_rustcrypto::RustCryptoProvider::default(), suite);
    }
}
