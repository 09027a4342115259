//! Just enough CSV for traces and workload tables: a header row, comma
//! separated fields without quoting, `#` comment lines and blank lines skipped.

use std::collections::HashMap;

use crate::SimError;

/// One data row, fields looked up by header name.
pub struct Row<'a> {
    pub line: usize,
    fields: HashMap<&'a str, &'a str>,
}

impl<'a> Row<'a> {
    /// A required field.
    pub fn get(&self, name: &str) -> Result<&'a str, SimError> {
        self.optional(name).ok_or_else(|| SimError::Csv {
            line: self.line,
            why: format!("missing value for column {name:?}"),
        })
    }

    /// A field that may be absent from the header or empty.
    pub fn optional(&self, name: &str) -> Option<&'a str> {
        self.fields.get(name).copied().filter(|v| !v.is_empty())
    }

    pub fn number(&self, name: &str) -> Result<f64, SimError> {
        let text = self.get(name)?;
        parse_number(text).ok_or_else(|| self.bad(name, text))
    }

    pub fn optional_number(&self, name: &str) -> Result<Option<f64>, SimError> {
        self.optional(name)
            .map(|text| parse_number(text).ok_or_else(|| self.bad(name, text)))
            .transpose()
    }

    fn bad(&self, name: &str, text: &str) -> SimError {
        SimError::Csv {
            line: self.line,
            why: format!("column {name:?}: {text:?} is not a finite number >= 0"),
        }
    }
}

fn parse_number(text: &str) -> Option<f64> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// Parses `text`, checking that every column in `required` is in the header.
pub fn parse<'a>(text: &'a str, required: &[&str]) -> Result<Vec<Row<'a>>, SimError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let (_, header) = lines.next().ok_or(SimError::Csv {
        line: 1,
        why: "empty file: expected a header row".into(),
    })?;
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    if let Some(missing) = required.iter().find(|c| !columns.contains(c)) {
        return Err(SimError::Csv {
            line: 1,
            why: format!("header lacks column {missing:?} (has: {header})"),
        });
    }
    lines
        .map(|(line, text)| {
            let values: Vec<&str> = text.split(',').map(str::trim).collect();
            if values.len() != columns.len() {
                return Err(SimError::Csv {
                    line,
                    why: format!("{} fields, header has {}", values.len(), columns.len()),
                });
            }
            Ok(Row {
                line,
                fields: columns.iter().copied().zip(values).collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_by_header_name_with_clear_errors() {
        let rows = parse("# comment\nb,a\n\n2,x\n", &["a"]).unwrap();
        assert_eq!((rows[0].line, rows[0].get("a").unwrap()), (4, "x"));
        assert_eq!(rows[0].number("b").unwrap(), 2.0);
        assert_eq!(rows[0].optional("c"), None);
        let err = parse("a\n1,2\n", &["a"]).err().unwrap().to_string();
        assert!(err.contains("line 2") && err.contains("2 fields"), "{err}");
        let err = parse("a\n", &["b"]).err().unwrap().to_string();
        assert!(err.contains("lacks column \"b\""), "{err}");
        let rows = parse("a\n-1\n", &["a"]).unwrap();
        assert!(rows[0].number("a").is_err());
    }
}
