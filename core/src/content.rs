//! Content blocks of a `/v1/proxy` request: validation (mesh-behaviour §2.3) and the
//! per-family `content_json` rendering (§4.5).

use std::borrow::Cow;

use serde::Deserialize;

use crate::json::{write_escaped, write_str};
use crate::provider::Family;

/// A block's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockType {
    Text,
    Image,
    Document,
    Audio,
    Video,
}

impl BlockType {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "text" => Self::Text,
            "image" => Self::Image,
            "document" => Self::Document,
            "audio" => Self::Audio,
            "video" => Self::Video,
            _ => return None,
        })
    }

    /// The wire name (`content_type` extra of `content_type_not_supported_by_model`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Image => "image",
            Self::Document => "document",
            Self::Audio => "audio",
            Self::Video => "video",
        }
    }

    /// Admission weight: text 1, image 5, document 8, audio 10, video 25.
    #[must_use]
    pub fn weight(self) -> u32 {
        match self {
            Self::Text => 1,
            Self::Image => 5,
            Self::Document => 8,
            Self::Audio => 10,
            Self::Video => 25,
        }
    }

    /// Largest decoded size of an inline block.
    fn max_bytes(self) -> usize {
        match self {
            Self::Text => usize::MAX,
            Self::Image => 20 << 20,
            Self::Document => 50 << 20,
            Self::Audio => 75 << 20,
            Self::Video => 200 << 20,
        }
    }
}

/// A block as the client sent it; empty strings count as unset (as in Mesh).
#[derive(Debug, Default, Deserialize)]
pub struct RawBlock<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub media_type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub url: Option<Cow<'a, str>>,
}

/// A validated block.
#[derive(Debug)]
pub struct Block<'a> {
    pub kind: BlockType,
    pub text: &'a str,
    pub media_type: &'a str,
    pub data: &'a str,
    pub url: &'a str,
}

/// Mesh's `detail` strings for `invalid_request`.
pub const BOTH_QUERY_AND_CONTENT: &str = "request must set either query or content, not both";
pub const EMPTY_REQUEST: &str = "request must set either query or content";
pub const INVALID_MAX_TOKENS: &str = "max_tokens must be a positive integer";
pub const UNKNOWN_BLOCK_TYPE: &str = "unknown content block type";
pub const BLOCK_TOO_LARGE: &str = "content block exceeds the size limit for its type";
pub const MISSING_BLOCK_DATA: &str = "content block must set either data or url";
pub const MISSING_MEDIA_TYPE: &str = "non-text content block must set media_type";

fn s<'a>(v: &'a Option<Cow<'a, str>>) -> &'a str {
    v.as_deref().unwrap_or("")
}

/// Validates the blocks in Mesh's order; `Err(detail)` for `invalid_request`.
pub fn resolve<'a>(query: &'a str, content: &'a [RawBlock<'a>]) -> Result<Vec<Block<'a>>, &'static str> {
    match (query.is_empty(), content.is_empty()) {
        (false, false) => return Err(BOTH_QUERY_AND_CONTENT),
        (true, true) => return Err(EMPTY_REQUEST),
        (false, true) => {
            return Ok(vec![Block {
                kind: BlockType::Text,
                text: query,
                media_type: "",
                data: "",
                url: "",
            }])
        }
        (true, false) => {}
    }
    content
        .iter()
        .map(|raw| {
            let kind = BlockType::parse(s(&raw.kind)).ok_or(UNKNOWN_BLOCK_TYPE)?;
            let block = Block {
                kind,
                text: s(&raw.text),
                media_type: s(&raw.media_type),
                data: s(&raw.data),
                url: s(&raw.url),
            };
            if kind != BlockType::Text {
                if block.data.is_empty() && block.url.is_empty() {
                    return Err(MISSING_BLOCK_DATA);
                }
                if !block.data.is_empty() && block.media_type.is_empty() {
                    return Err(MISSING_MEDIA_TYPE);
                }
                if block.data.len() / 4 * 3 > kind.max_bytes() {
                    return Err(BLOCK_TOO_LARGE);
                }
            }
            Ok(block)
        })
        .collect()
}

fn data_uri(out: &mut Vec<u8>, block: &Block<'_>) {
    out.push(b'"');
    out.extend_from_slice(b"data:");
    write_escaped(out, block.media_type);
    out.extend_from_slice(b";base64,");
    write_escaped(out, block.data);
    out.push(b'"');
}

fn url_or_data_uri(out: &mut Vec<u8>, block: &Block<'_>) {
    if block.url.is_empty() {
        data_uri(out, block);
    } else {
        write_str(out, block.url);
    }
}

fn filename(out: &mut Vec<u8>, block: &Block<'_>) {
    let subtype = block.media_type.rsplit('/').next().unwrap_or("");
    out.extend_from_slice(b"\"document.");
    write_escaped(out, subtype);
    out.push(b'"');
}

fn audio_format(media_type: &str) -> Option<&'static str> {
    match media_type {
        "audio/mpeg" | "audio/mp3" => Some("mp3"),
        "audio/wav" | "audio/x-wav" | "audio/wave" => Some("wav"),
        _ => None,
    }
}

/// Renders one block for `family` into `out`; `Err(())` when the family cannot carry it.
fn render_block(family: Family, block: &Block<'_>, out: &mut Vec<u8>) -> Result<(), ()> {
    use BlockType::{Audio, Document, Image, Text, Video};
    let inline = block.url.is_empty();
    match (family, block.kind) {
        (Family::Generic, _) => return Err(()),
        (Family::Anthropic | Family::OpenAi | Family::Ollama, Text) => {
            out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
            write_str(out, block.text);
            out.push(b'}');
        }
        (Family::OpenAiResponses, Text) => {
            out.extend_from_slice(b"{\"type\":\"input_text\",\"text\":");
            write_str(out, block.text);
            out.push(b'}');
        }
        (Family::Gemini, Text) => {
            out.extend_from_slice(b"{\"text\":");
            write_str(out, block.text);
            out.push(b'}');
        }
        (Family::Anthropic, Image | Document) => {
            out.extend_from_slice(if block.kind == Image {
                b"{\"type\":\"image\",\"source\":"
            } else {
                b"{\"type\":\"document\",\"source\":"
            });
            if inline {
                out.extend_from_slice(b"{\"type\":\"base64\",\"media_type\":");
                write_str(out, block.media_type);
                out.extend_from_slice(b",\"data\":");
                write_str(out, block.data);
            } else {
                out.extend_from_slice(b"{\"type\":\"url\",\"url\":");
                write_str(out, block.url);
            }
            out.extend_from_slice(b"}}");
        }
        (Family::OpenAi | Family::Ollama, Image) => {
            out.extend_from_slice(b"{\"type\":\"image_url\",\"image_url\":{\"url\":");
            url_or_data_uri(out, block);
            out.extend_from_slice(b"}}");
        }
        (Family::OpenAi, Document) if inline => {
            out.extend_from_slice(b"{\"type\":\"file\",\"file\":{\"filename\":");
            filename(out, block);
            out.extend_from_slice(b",\"file_data\":");
            data_uri(out, block);
            out.extend_from_slice(b"}}");
        }
        (Family::OpenAi, Audio) if inline => {
            let format = audio_format(block.media_type).ok_or(())?;
            out.extend_from_slice(b"{\"type\":\"input_audio\",\"input_audio\":{\"data\":");
            write_str(out, block.data);
            out.extend_from_slice(b",\"format\":\"");
            out.extend_from_slice(format.as_bytes());
            out.extend_from_slice(b"\"}}");
        }
        (Family::OpenAiResponses, Image) => {
            out.extend_from_slice(b"{\"type\":\"input_image\",\"image_url\":");
            url_or_data_uri(out, block);
            out.push(b'}');
        }
        (Family::OpenAiResponses, Document) if inline => {
            out.extend_from_slice(b"{\"type\":\"input_file\",\"filename\":");
            filename(out, block);
            out.extend_from_slice(b",\"file_data\":");
            data_uri(out, block);
            out.push(b'}');
        }
        (Family::Gemini, Image | Document | Audio | Video) => {
            if inline {
                out.extend_from_slice(b"{\"inline_data\":{\"mime_type\":");
                write_str(out, block.media_type);
                out.extend_from_slice(b",\"data\":");
                write_str(out, block.data);
            } else {
                out.extend_from_slice(b"{\"file_data\":{\"mime_type\":");
                write_str(out, block.media_type);
                out.extend_from_slice(b",\"file_uri\":");
                write_str(out, block.url);
            }
            out.extend_from_slice(b"}}");
        }
        _ => return Err(()),
    }
    Ok(())
}

/// The `content_json` array for `family`; generic providers get `[]` (they use `{{query}}`).
/// `Err(block type)` when the family cannot carry a block (400 `content_type_not_supported_by_model`).
pub fn content_json(family: Family, blocks: &[Block<'_>]) -> Result<Vec<u8>, BlockType> {
    let mut out = Vec::with_capacity(
        64 + blocks
            .iter()
            .map(|b| b.text.len() + b.data.len() + b.url.len())
            .sum::<usize>(),
    );
    out.push(b'[');
    if family == Family::Generic {
        if let Some(block) = blocks.iter().find(|b| b.kind != BlockType::Text) {
            return Err(block.kind);
        }
    } else {
        for (i, block) in blocks.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            render_block(family, block, &mut out).map_err(|()| block.kind)?;
        }
    }
    out.push(b']');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn block<'a>(kind: BlockType, media_type: &'a str, data: &'a str, url: &'a str) -> Block<'a> {
        Block {
            kind,
            text: "",
            media_type,
            data,
            url,
        }
    }

    fn rendered(family: Family, blocks: &[Block<'_>]) -> serde_json::Value {
        serde_json::from_slice(&content_json(family, blocks).unwrap()).unwrap()
    }

    #[test]
    fn test_families_render_blocks_as_mesh() {
        let text = Block {
            kind: BlockType::Text,
            text: "hi \"x\"",
            media_type: "",
            data: "",
            url: "",
        };
        let image = block(BlockType::Image, "image/png", "AAAA", "");
        let pdf = block(BlockType::Document, "application/pdf", "BBBB", "");
        assert_eq!(
            rendered(Family::OpenAi, &[text, image, pdf]),
            json!([{"type":"text","text":"hi \"x\""},
                   {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},
                   {"type":"file","file":{"filename":"document.pdf","file_data":"data:application/pdf;base64,BBBB"}}])
        );
        let by_url = block(BlockType::Image, "", "", "https://x/i.png");
        assert_eq!(
            rendered(Family::Anthropic, &[by_url]),
            json!([{"type":"image","source":{"type":"url","url":"https://x/i.png"}}])
        );
        let audio = block(BlockType::Audio, "audio/x-wav", "CC", "");
        assert_eq!(
            rendered(Family::OpenAi, &[audio]),
            json!([{"type":"input_audio","input_audio":{"data":"CC","format":"wav"}}])
        );
        let video = block(BlockType::Video, "video/mp4", "", "gs://v");
        assert_eq!(
            rendered(Family::Gemini, &[video]),
            json!([{"file_data":{"mime_type":"video/mp4","file_uri":"gs://v"}}])
        );
        let doc = block(BlockType::Document, "application/pdf", "DD", "");
        assert_eq!(
            rendered(Family::OpenAiResponses, &[doc]),
            json!([{"type":"input_file","filename":"document.pdf","file_data":"data:application/pdf;base64,DD"}])
        );
    }

    #[test]
    fn test_unsupported_combinations_name_the_block_type() {
        let ogg = block(BlockType::Audio, "audio/ogg", "CC", "");
        assert_eq!(content_json(Family::OpenAi, &[ogg]), Err(BlockType::Audio));
        let doc_url = block(BlockType::Document, "application/pdf", "", "https://x/d.pdf");
        assert_eq!(content_json(Family::OpenAi, &[doc_url]), Err(BlockType::Document));
        let video = block(BlockType::Video, "video/mp4", "VV", "");
        assert_eq!(content_json(Family::Anthropic, &[video]), Err(BlockType::Video));
        let text = Block {
            kind: BlockType::Text,
            text: "q",
            media_type: "",
            data: "",
            url: "",
        };
        assert_eq!(content_json(Family::Generic, &[text]).unwrap(), b"[]");
    }

    #[test]
    fn test_resolve_checks_in_mesh_order() {
        let raw = |kind: &'static str, media: &'static str, data: &'static str| RawBlock {
            kind: Some(kind.into()),
            media_type: Some(media.into()),
            data: Some(data.into()),
            ..RawBlock::default()
        };
        assert_eq!(
            resolve("q", &[raw("text", "", "")]).unwrap_err(),
            BOTH_QUERY_AND_CONTENT
        );
        assert_eq!(resolve("", &[]).unwrap_err(), EMPTY_REQUEST);
        assert_eq!(resolve("", &[raw("gif", "", "")]).unwrap_err(), UNKNOWN_BLOCK_TYPE);
        assert_eq!(resolve("", &[raw("image", "", "")]).unwrap_err(), MISSING_BLOCK_DATA);
        assert_eq!(
            resolve("", &[raw("image", "", "AAAA")]).unwrap_err(),
            MISSING_MEDIA_TYPE
        );
        let big = "A".repeat((20 << 20) / 3 * 4 + 8);
        let blocks = [RawBlock {
            kind: Some("image".into()),
            media_type: Some("image/png".into()),
            data: Some(big.into()),
            ..RawBlock::default()
        }];
        assert_eq!(resolve("", &blocks).unwrap_err(), BLOCK_TOO_LARGE);
    }
}
