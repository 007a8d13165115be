//! Cost in integer nano-USD (mesh-behaviour §6.2, exact instead of Mesh's float64) and token
//! estimates for upstreams that report no usage.
//!
//! Prices are per token class (Cosmos §6): input, output, cache read, cache write (5 min) and
//! cache write (1 h), with an optional long-context tier that replaces them when the prompt
//! (input and cached tokens together) exceeds a threshold.
//!
//! Every price computation of the crate is here: a call's worst case (what a decision reserves),
//! its cost (what the exchange settles), the tiers and the config's price classes. The module
//! depends on nothing else in the crate; the snapshot copies a model's prices into [`Rates`].

use std::collections::BTreeMap;

/// Per-1k-token prices of one tier in nano-USD, every class resolved (see [`Prices::resolve`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prices {
    pub input: i64,
    pub output: i64,
    pub cache_read: i64,
    pub cache_write: i64,
    pub cache_write_1h: i64,
}

impl Prices {
    /// Fills the cache classes a registry leaves unset: cache reads and writes cost what input
    /// does, 1 h writes what 5 min writes do. So a model priced for input and output only
    /// charges cached prompt tokens as input, as before the classes existed.
    #[must_use]
    pub fn resolve(
        input: i64,
        output: i64,
        cache_read: Option<i64>,
        cache_write: Option<i64>,
        cache_write_1h: Option<i64>,
    ) -> Self {
        let cache_write = cache_write.unwrap_or(input);
        Self {
            input,
            output,
            cache_read: cache_read.unwrap_or(input),
            cache_write,
            cache_write_1h: cache_write_1h.unwrap_or(cache_write),
        }
    }

    /// Every class's price, for validation.
    #[must_use]
    pub fn all(&self) -> [i64; 5] {
        [
            self.input,
            self.output,
            self.cache_read,
            self.cache_write,
            self.cache_write_1h,
        ]
    }
}

/// The tier that applies above a prompt size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongContext {
    /// Prompts of more tokens than this (input, cache read and cache write) use [`Self::prices`].
    pub threshold_tokens: i64,
    pub prices: Prices,
}

impl LongContext {
    /// The long-context tier: both a positive threshold and prices, or neither. Prices name known
    /// classes and are non-negative; a class the tier leaves out keeps the base tier's own price
    /// (`base`, as configured), and unset cache classes fall back within the tier as in [`Prices::resolve`].
    pub(crate) fn from_config(
        errors: &mut Vec<String>,
        what: &str,
        base: [Option<i64>; 5],
        threshold: Option<i64>,
        prices: Option<&BTreeMap<String, i64>>,
    ) -> Option<LongContext> {
        let (threshold, prices) = match (threshold, prices) {
            (None, None) => return None,
            (Some(threshold), Some(prices)) => (threshold, prices),
            _ => {
                errors.push(format!(
                    "{what}: long_context_threshold_tokens and long_context_prices go together"
                ));
                return None;
            }
        };
        if threshold <= 0 {
            errors.push(format!("{what}: long_context_threshold_tokens must be positive"));
        }
        let mut tier = base;
        for (class, &price) in prices {
            if price < 0 {
                errors.push(format!("{what}: long_context_prices.{class} is negative"));
            }
            match PRICE_CLASSES.iter().position(|c| c == class) {
                Some(at) => tier[at] = Some(price),
                None => errors.push(format!(
                    "{what}: long_context_prices has unknown class {class:?} (one of {PRICE_CLASSES:?})"
                )),
            }
        }
        let [input, output, cache_read, cache_write, cache_write_1h] = tier;
        let prices = Prices::resolve(
            input.unwrap_or(0),
            output.unwrap_or(0),
            cache_read,
            cache_write,
            cache_write_1h,
        );
        Some(LongContext {
            threshold_tokens: threshold,
            prices,
        })
    }
}

/// The token classes a long-context tier may price, in [`Prices::all`] order.
const PRICE_CLASSES: [&str; 5] = ["input", "output", "cache_read", "cache_write", "cache_write_1h"];

/// Tokens of one call by price class. The classes are disjoint: `input` excludes cached tokens
/// (the IR's convention); negative counts count as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: i64,
    pub output: i64,
    pub cache_read: i64,
    pub cache_write: i64,
    pub cache_write_1h: i64,
}

impl Tokens {
    /// The prompt's size for the long-context threshold: input and every cached class.
    #[must_use]
    pub fn prompt(&self) -> i64 {
        [self.input, self.cache_read, self.cache_write, self.cache_write_1h]
            .iter()
            .fold(0i64, |sum, &n| sum.saturating_add(n.max(0)))
    }
}

/// `value / divisor` rounded half up; non-positive values are 0.
fn round_div(value: i128, divisor: i128) -> i64 {
    if value <= 0 {
        return 0;
    }
    i64::try_from((value + divisor / 2) / divisor).unwrap_or(i64::MAX)
}

/// `value × price / divisor`, rounded half up on the exact rational; negative results are 0.
fn scaled(value: i128, price: i128, divisor: i128) -> i64 {
    round_div(value.saturating_mul(price), divisor)
}

/// What one call on a model is priced at: the model's tiers and per-second price and its
/// provider's per-search price, copied at the decision so the call is priced as it was admitted
/// (a config change mid-call moves neither its reservation nor its cost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rates {
    pub prices: Prices,
    pub long_context: Option<LongContext>,
    pub per_second_nano: i64,
    pub web_search_nano: i64,
}

impl Rates {
    /// The prices for a prompt of `prompt_tokens`: the long-context tier above its threshold.
    #[must_use]
    pub fn tier(&self, prompt_tokens: i64) -> &Prices {
        match &self.long_context {
            Some(long) if prompt_tokens > long.threshold_tokens => &long.prices,
            _ => &self.prices,
        }
    }

    /// `(input_cost_nano, output_cost_nano)` of a call: each class's tokens × its per-1k price in
    /// the tier the prompt selects, summed exactly and rounded once; web searches × the provider's
    /// per-search price go to input; `seconds` × the per-second price to output. `seconds` is taken
    /// at microsecond precision (rounded half up), the only float involved.
    #[must_use]
    pub fn price(&self, tokens: &Tokens, seconds: f64, web_searches: i64) -> (i64, i64) {
        let prices = self.tier(tokens.prompt());
        let class = |n: i64, price: i64| i128::from(n.max(0)) * i128::from(price);
        let prompt = class(tokens.input, prices.input)
            + class(tokens.cache_read, prices.cache_read)
            + class(tokens.cache_write, prices.cache_write)
            + class(tokens.cache_write_1h, prices.cache_write_1h);
        let input = round_div(prompt, 1000).saturating_add(scaled(web_searches.into(), self.web_search_nano.into(), 1));
        #[expect(
            clippy::cast_possible_truncation,
            reason = "seconds of one call fit an i64 of microseconds"
        )]
        let micros = if seconds.is_finite() && seconds > 0.0 {
            (seconds * 1e6).round() as i64
        } else {
            0
        };
        let output = scaled(tokens.output.max(0).into(), prices.output.into(), 1000).saturating_add(scaled(
            micros.into(),
            self.per_second_nano.into(),
            1_000_000,
        ));
        (input, output)
    }

    /// The worst-case cost of a call in nano-USD, what a decision reserves: `input_tokens` and
    /// `output_tokens` (the call's bounds, no cached tokens) × prices, `web_searches` × the
    /// per-search price, nothing for seconds.
    #[must_use]
    pub fn worst_case(&self, input_tokens: i64, output_tokens: i64, web_searches: i64) -> i64 {
        let tokens = Tokens {
            input: input_tokens,
            output: output_tokens,
            ..Tokens::default()
        };
        let (input, output) = self.price(&tokens, 0.0, web_searches);
        input.saturating_add(output)
    }
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
    use crate::snapshot::{Model, Provider};
    use proptest::prelude::*;

    /// [`Rates::price`] of `model` on `provider`.
    fn price_tokens(model: &Model, provider: &Provider, tokens: &Tokens, seconds: f64, searches: i64) -> (i64, i64) {
        model.rates(provider).price(tokens, seconds, searches)
    }

    /// [`price_tokens`] for a call without cached tokens.
    fn price(model: &Model, provider: &Provider, input: i64, output: i64, seconds: f64, searches: i64) -> (i64, i64) {
        let tokens = Tokens {
            input,
            output,
            ..Tokens::default()
        };
        price_tokens(model, provider, &tokens, seconds, searches)
    }

    #[test]
    fn test_price_rounds_half_up_and_adds_searches_and_seconds() {
        let s = snapshot();
        let mut model = s.models[0].clone(); // 1000 / 2000 nano per 1k
        let mut p = provider();
        p.web_search_price_nano = 10_000_000;
        assert_eq!(price(&model, &p, 1, 1, 0.0, 0), (1, 2));
        model.prices.input = 1500;
        assert_eq!(price(&model, &p, 1, 0, 0.0, 2), (20_000_002, 0), "1.5 rounds up to 2");
        model.price_per_second_nano = 3;
        assert_eq!(price(&model, &p, 0, 0, 2.5, 0), (0, 8), "7.5 rounds up");
        assert_eq!(price(&model, &p, -5, -5, -1.0, -1), (0, 0));
    }

    #[test]
    fn test_cache_classes_have_their_own_prices_and_sum_before_rounding() {
        let s = snapshot();
        let mut model = s.models[0].clone();
        model.prices = Prices::resolve(3_000, 15_000, Some(300), Some(3_750), Some(6_000));
        let tokens = Tokens {
            input: 1,
            output: 0,
            cache_read: 1,
            cache_write: 1,
            cache_write_1h: 1,
        };
        // 3 + 0.3 + 3.75 + 6 = 13.05 nano: one rounding, not four (which would give 3+0+4+6 = 13).
        assert_eq!(price_tokens(&model, &provider(), &tokens, 0.0, 0), (13, 0));
        let tokens = Tokens {
            input: 100,
            output: 10,
            cache_read: 2_000,
            cache_write: 400,
            cache_write_1h: 0,
        };
        assert_eq!(
            price_tokens(&model, &provider(), &tokens, 0.0, 0),
            (300 + 600 + 1_500, 150)
        );
    }

    #[test]
    fn test_unset_cache_prices_fall_back_to_input_and_5_minute_writes() {
        let prices = Prices::resolve(10, 20, None, Some(12), None);
        assert_eq!(
            prices,
            Prices {
                input: 10,
                output: 20,
                cache_read: 10,
                cache_write: 12,
                cache_write_1h: 12
            }
        );
        assert_eq!(Prices::resolve(10, 20, None, None, None).all(), [10, 20, 10, 10, 10]);
    }

    #[test]
    fn test_long_context_tier_applies_above_the_threshold_of_all_prompt_tokens() {
        let s = snapshot();
        let mut model = s.models[0].clone();
        model.prices = Prices::resolve(1_000, 2_000, Some(100), None, None);
        model.long_context = Some(LongContext {
            threshold_tokens: 1_000,
            prices: Prices::resolve(2_000, 4_000, Some(200), None, None),
        });
        let at = Tokens {
            input: 500,
            output: 1_000,
            cache_read: 500,
            ..Tokens::default()
        };
        assert_eq!(
            price_tokens(&model, &provider(), &at, 0.0, 0),
            (500 + 50, 2_000),
            "1000 is not above 1000"
        );
        let above = Tokens { cache_write: 1, ..at };
        assert_eq!(
            price_tokens(&model, &provider(), &above, 0.0, 0),
            (1_000 + 100 + 2, 4_000),
            "output too"
        );
    }

    #[test]
    fn test_worst_case_prices_the_bounds_and_searches_but_no_seconds() {
        let s = snapshot();
        let mut model = s.models[0].clone(); // 1000 / 2000 nano per 1k
        model.price_per_second_nano = 1_000;
        let mut p = provider();
        p.web_search_price_nano = 10_000_000;
        let rates = model.rates(&p);
        assert_eq!(rates.worst_case(1, 4096, 0), 1 + 8192);
        assert_eq!(rates.worst_case(1, 4096, 1), 1 + 8192 + 10_000_000);
        model.long_context = Some(LongContext {
            threshold_tokens: 10,
            prices: Prices::resolve(2_000, 4_000, None, None, None),
        });
        assert_eq!(
            model.rates(&p).worst_case(11, 1000, 0),
            22 + 4_000,
            "the tier the bound selects"
        );
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
            model.prices.input = price_1k;
            let exact = i128::from(tokens) * i128::from(price_1k);
            let floor = exact / 1000;
            let reference = if exact % 1000 >= 500 { floor + 1 } else { floor };
            prop_assert_eq!(i128::from(price(&model, &provider(), tokens, 0, 0.0, 0).0), reference);
        }

        /// The input cost of any mix of classes in either tier is the integer nearest to
        /// Σ tokens × price / 1000 (ties up): `1000·cost − 500 ≤ Σ < 1000·cost + 500`.
        #[test]
        fn prop_class_mix_is_the_nearest_integer_to_the_exact_sum(
            counts in proptest::array::uniform5(0i64..50_000_000),
            base in proptest::array::uniform5(0i64..100_000_000),
            long in proptest::array::uniform5(0i64..100_000_000),
            threshold in 0i64..200_000_000,
        ) {
            let s = snapshot();
            let mut model = s.models[0].clone();
            let tier_of = |p: [i64; 5]| Prices { input: p[0], output: p[1], cache_read: p[2], cache_write: p[3], cache_write_1h: p[4] };
            model.prices = tier_of(base);
            model.long_context = Some(LongContext { threshold_tokens: threshold, prices: tier_of(long) });
            let [input, output, cache_read, cache_write, cache_write_1h] = counts;
            let tokens = Tokens { input, output, cache_read, cache_write, cache_write_1h };
            let prompt = input + cache_read + cache_write + cache_write_1h;
            let rates = if prompt > threshold { long } else { base };
            let exact: i128 = [(input, rates[0]), (cache_read, rates[2]), (cache_write, rates[3]), (cache_write_1h, rates[4])]
                .iter().map(|&(n, p)| i128::from(n) * i128::from(p)).sum();
            let (cost, out) = price_tokens(&model, &provider(), &tokens, 0.0, 0);
            let cost = i128::from(cost);
            prop_assert!(1000 * cost - 500 <= exact && exact < 1000 * cost + 500, "{cost} vs {exact}");
            let exact_out = i128::from(output) * i128::from(rates[1]);
            prop_assert!(1000 * i128::from(out) - 500 <= exact_out && exact_out < 1000 * i128::from(out) + 500);
        }

        /// With no cache prices set, cached tokens cost exactly what the same tokens as input do.
        #[test]
        fn prop_unpriced_cache_classes_cost_as_input(input in 0i64..1_000_000, read in 0i64..1_000_000,
                                                     write in 0i64..1_000_000, price_1k in 0i64..10_000_000) {
            let s = snapshot();
            let mut model = s.models[0].clone();
            model.prices = Prices::resolve(price_1k, 0, None, None, None);
            let cached = Tokens { input, cache_read: read, cache_write: write, ..Tokens::default() };
            prop_assert_eq!(price_tokens(&model, &provider(), &cached, 0.0, 0), price(&model, &provider(), input + read + write, 0, 0.0, 0));
        }
    }
}
