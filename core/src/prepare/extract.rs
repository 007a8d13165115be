//! Results read from an upstream response with the provider's plan: an embedding's vector and
//! usage, a generation's media, job and usage.

use crate::provider::Plan;

/// Why an upstream body could not be read (the caller answers 502 `upstream_unavailable`).
pub type ExtractError = String;

/// The embedding vector (as compact JSON) and input tokens of an upstream response.
pub fn extract_embedding(plan: &Plan, body: &[u8]) -> Result<(Vec<u8>, i64), ExtractError> {
    let embedding = plan.embedding.as_ref().ok_or("provider has no embedding plan")?;
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("response is not JSON: {e}"))?;
    let vector = embedding
        .vector
        .get(&value)
        .and_then(serde_json::Value::as_array)
        .filter(|v| v.iter().all(serde_json::Value::is_number));
    let vector = vector.ok_or("vector path does not resolve to an array of numbers")?;
    let json = serde_json::to_vec(vector).map_err(|e| e.to_string())?;
    let tokens = embedding.usage.as_ref().and_then(|p| p.get_int(&value)).unwrap_or(0);
    Ok((json, tokens))
}

/// What a generation response carries: media outputs, seconds, job id, job status, usage.
#[derive(Debug, Default, PartialEq)]
pub struct Generation {
    pub outputs: Vec<String>,
    pub seconds: f64,
    pub job_id: Option<String>,
    pub status: Option<String>,
    pub input_tokens: i64,
    pub output_tokens: i64,
}

/// Reads every configured generation path from an upstream response (submit, poll or result).
pub fn extract_generation(plan: &Plan, body: &[u8]) -> Result<Generation, ExtractError> {
    let generation = plan.generation.as_ref().ok_or("provider has no generation plan")?;
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("response is not JSON: {e}"))?;
    let outputs = match generation.media.as_ref().and_then(|p| p.get(&value)) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|i| i.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let seconds = match generation.duration.as_ref().and_then(|p| p.get(&value)) {
        Some(serde_json::Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(serde_json::Value::String(s)) => s.trim().parse().unwrap_or(0.0),
        _ => 0.0,
    };
    Ok(Generation {
        outputs,
        seconds,
        job_id: generation.job_id.as_ref().and_then(|p| p.get_text(&value)),
        status: generation.status.as_ref().and_then(|p| p.get_text(&value)),
        input_tokens: generation
            .usage_in
            .as_ref()
            .and_then(|p| p.get_int(&value))
            .unwrap_or(0),
        output_tokens: generation
            .usage_out
            .as_ref()
            .and_then(|p| p.get_int(&value))
            .unwrap_or(0),
    })
}
