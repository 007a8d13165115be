//! Cost in integer nano-USD (mesh-behaviour §6.2, exact instead of Mesh's float64) and token
//! estimates for upstreams that report no usage.

use crate::snapshot::{Model, Provider};

/// `value × price / divisor`, rounded half up on the exact rational; negative results are 0.
fn scaled(value: i128, price: i128, divisor: i128) -> i64 {
    let product = value.saturating_mul(price);
    if product <= 0 {
        return 0;
    }
    i64::try_from((product + divisor / 2) / divisor).unwrap_or(i64::MAX)
}

/// `(input_cost_nano, output_cost_nano)` of a call: tokens × per-1k prices; web searches ×
/// the provider's per-search price go to input; `seconds` × the per-second price to output.
/// `seconds` is taken at microsecond precision (rounded half up), the only float involved.
#[must_use]
pub fn price(model: &Model, provider: &Provider, input_tokens: i64, output_tokens: i64, seconds: f64, web_searches: i64) -> (i64, i64) {
    let input = scaled(input_tokens.into(), model.input_price_nano_per_1k.into(), 1000)
        .saturating_add(scaled(web_searches.into(), provider.web_search_price_nano.into(), 1));
    #[expect(clippy::cast_possible_truncation, reason = "seconds of one call fit an i64 of microseconds")]
    let micros = if seconds.is_finite() && seconds > 0.0 { (seconds * 1e6).round() as i64 } else { 0 };
    let output = scaled(output_tokens.into(), model.output_price_nano_per_1k.into(), 1000)
        .saturating_add(scaled(micros.into(), model.price_per_second_nano.into(), 1_000_000));
    (input, output)
}

/// Tokens in `text` by OpenAI's `cl100k_base` BPE (embedded in the binary, no download). The
/// first call builds the encoder (about 0.1-0.3 s); later calls reuse it.
#[must_use]
pub fn estimate_tokens(text: &str) -> usize {
    if text.is_empty() {
        return 0;
    }
    tiktoken_rs::cl100k_base_singleton().encode_ordinary(text).len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::test_support::{provider, snapshot};
    use proptest::prelude::*;

    #[test]
    fn test_price_rounds_half_up_and_adds_searches_and_seconds() {
        let s = snapshot();
        let mut model = s.models[0].clone(); // 1000 / 2000 nano per 1k
        let mut p = provider();
        p.web_search_price_nano = 10_000_000;
        assert_eq!(price(&model, &p, 1, 1, 0.0, 0), (1, 2));
        model.input_price_nano_per_1k = 1500;
        assert_eq!(price(&model, &p, 1, 0, 0.0, 2), (20_000_002, 0), "1.5 rounds up to 2");
        model.price_per_second_nano = 3;
        assert_eq!(price(&model, &p, 0, 0, 2.5, 0), (0, 8), "7.5 rounds up");
        assert_eq!(price(&model, &p, -5, -5, -1.0, -1), (0, 0));
    }

    #[test]
    fn test_token_estimate_is_cl100k() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("hello world"), 2);
    }

    proptest! {
        /// Token cost equals the rational reference rounded half up (f64-free).
        #[test]
        fn prop_token_cost_matches_rational_reference(tokens in 0i64..10_000_000, price_1k in 0i64..1_000_000_000) {
            let s = snapshot();
            let mut model = s.models[0].clone();
            model.input_price_nano_per_1k = price_1k;
            let exact = i128::from(tokens) * i128::from(price_1k);
            let floor = exact / 1000;
            let reference = if exact % 1000 >= 500 { floor + 1 } else { floor };
            prop_assert_eq!(i128::from(price(&model, &provider(), tokens, 0, 0.0, 0).0), reference);
        }
    }
}
