//! The configuration's shape as the core reads it, so that the Python side that writes it can be
//! checked against it field by field (one schema, written once in the serde types and checked,
//! rather than kept by hand in two languages).
//!
//! [`shape`] drives a type's `Deserialize` with a probe that answers every request with an empty
//! value and records what was asked: a struct's field names (each field then probed in turn), a
//! sequence's element (probed once), an option's inner value. Validation that runs after
//! decoding may refuse the probe's empty values; what was recorded by then is kept.

use std::cell::RefCell;
use std::rc::Rc;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// What a value is, as far as its decoding asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Shape {
    /// A scalar, a string, bytes, a map with free keys, or anything not probed further.
    #[default]
    Leaf,
    /// A struct: its fields by wire name, in declaration order (which a struct decoded from an
    /// array goes by).
    Struct(Vec<(String, Shape)>),
    /// A sequence of one shape.
    Seq(Box<Shape>),
}

impl Shape {
    /// As JSON: a struct is an object of its fields (in order), a sequence a one-element array,
    /// a leaf `null`.
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut out = Vec::new();
        self.write(&mut out);
        String::from_utf8(out).expect("JSON text")
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Self::Leaf => out.extend_from_slice(b"null"),
            Self::Struct(fields) => {
                out.push(b'{');
                for (i, (name, shape)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    crate::json::write_str(out, name);
                    out.push(b':');
                    shape.write(out);
                }
                out.push(b'}');
            }
            Self::Seq(item) => {
                out.push(b'[');
                item.write(out);
                out.push(b']');
            }
        }
    }
}

/// The shape `T`'s decoding asks for.
#[must_use]
pub fn shape<'de, T: Deserialize<'de>>() -> Shape {
    let node = Rc::new(RefCell::new(Shape::Leaf));
    // NOTE: the probe's empty values may fail validation; the shape was recorded before that.
    let _ = T::deserialize(Probe(Rc::clone(&node)));
    let shape = node.borrow().clone();
    shape
}

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("probe")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Stop
    }
}

struct Probe(Rc<RefCell<Shape>>);

struct Fields {
    node: Rc<RefCell<Shape>>,
    names: std::slice::Iter<'static, &'static str>,
    current: Option<&'static str>,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = Stop;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Stop> {
        let Some(name) = self.names.next() else {
            return Ok(None);
        };
        self.current = Some(name);
        seed.deserialize((*name).into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Stop> {
        let name = self.current.take().unwrap_or_default();
        let child = Rc::new(RefCell::new(Shape::Leaf));
        let result = seed.deserialize(Probe(Rc::clone(&child)));
        let shape = child.borrow().clone();
        if let Shape::Struct(fields) = &mut *self.node.borrow_mut() {
            fields.push((name.to_owned(), shape));
        }
        result
    }
}

struct One {
    node: Rc<RefCell<Shape>>,
    done: bool,
}

/// A tuple's `len` elements, each probed and not recorded (positions are not names).
struct Positions(usize);

impl<'de> SeqAccess<'de> for Positions {
    type Error = Stop;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Stop> {
        if self.0 == 0 {
            return Ok(None);
        }
        self.0 -= 1;
        seed.deserialize(Probe(Rc::new(RefCell::new(Shape::Leaf)))).map(Some)
    }
}

impl<'de> SeqAccess<'de> for One {
    type Error = Stop;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Stop> {
        if std::mem::replace(&mut self.done, true) {
            return Ok(None);
        }
        let child = Rc::new(RefCell::new(Shape::Leaf));
        let result = seed.deserialize(Probe(Rc::clone(&child)));
        *self.node.borrow_mut() = Shape::Seq(Box::new(child.borrow().clone()));
        result.map(Some)
    }
}

macro_rules! leaf {
    ($($method:ident => $visit:ident($value:expr)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
            visitor.$visit($value)
        })*
    };
}

impl<'de> Deserializer<'de> for Probe {
    type Error = Stop;

    leaf! {
        deserialize_bool => visit_bool(false),
        deserialize_i8 => visit_i8(0),
        deserialize_i16 => visit_i16(0),
        deserialize_i32 => visit_i32(0),
        deserialize_i64 => visit_i64(0),
        deserialize_u8 => visit_u8(0),
        deserialize_u16 => visit_u16(0),
        deserialize_u32 => visit_u32(0),
        deserialize_u64 => visit_u64(0),
        deserialize_f32 => visit_f32(0.0),
        deserialize_f64 => visit_f64(0.0),
        deserialize_char => visit_char('a'),
        deserialize_str => visit_str(""),
        deserialize_string => visit_string(String::new()),
        deserialize_bytes => visit_bytes(&[]),
        deserialize_byte_buf => visit_byte_buf(Vec::new()),
        deserialize_identifier => visit_str(""),
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_unit()
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_unit()
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_unit()
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_seq(One {
            node: self.0,
            done: false,
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_seq(Positions(len))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.deserialize_tuple(len, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_map(de::value::MapDeserializer::<'de, std::iter::Empty<((), ())>, Stop>::new(std::iter::empty()))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        *self.0.borrow_mut() = Shape::Struct(Vec::new());
        visitor.visit_map(Fields {
            node: self.0,
            names: fields.iter(),
            current: None,
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        let first = variants.first().copied().unwrap_or_default();
        visitor.visit_enum(first.into_deserializer())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[expect(dead_code, reason = "only the shape is read")]
    struct Inner {
        a: i64,
        #[serde(rename = "bee")]
        b: Option<String>,
    }

    #[derive(Deserialize)]
    #[expect(dead_code, reason = "only the shape is read")]
    struct Outer {
        name: String,
        #[serde(default)]
        items: Vec<Inner>,
        one: Option<Inner>,
        tags: std::collections::BTreeMap<String, String>,
        pair: (String, i64),
    }

    #[test]
    fn a_types_fields_nested_structs_and_sequences_are_recorded() {
        let inner = r#"{"a":null,"bee":null}"#;
        assert_eq!(
            shape::<Outer>().to_json(),
            format!(r#"{{"name":null,"items":[{inner}],"one":{inner},"tags":null,"pair":null}}"#)
        );
    }
}
