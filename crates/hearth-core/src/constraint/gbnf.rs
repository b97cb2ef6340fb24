//! llama.cpp's GBNF grammars (llama-server's `grammar`, WebLLM's `{type: "grammar"}`) rewritten as
//! the Lark grammars llguidance compiles: rules keep their structure; literals, character classes
//! and repetitions map one to one.

use crate::error::CoreError;
use std::collections::HashMap;

/// The Lark grammar of a GBNF grammar (its `root` rule becomes `start`). `param` names the request
/// parameter in errors, which also give the line of the problem.
pub fn gbnf_to_lark(gbnf: &str, param: &str) -> Result<String, CoreError> {
    let mut parser = Parser { text: gbnf.as_bytes(), at: 0, names: HashMap::new(), param };
    parser.names.insert("root".to_string(), "start".to_string());
    let mut rules = Vec::new();
    parser.skip_space(true);
    while parser.at < parser.text.len() {
        let name = parser.name()?;
        parser.skip_space(false);
        if !parser.eat("::=") {
            return Err(parser.error("expected '::=' after a rule name"));
        }
        let body = parser.alternatives(true)?;
        rules.push(format!("{name}: {body}"));
        parser.skip_space(true);
    }
    if !parser.names.values().any(|n| n == "start") || !rules.iter().any(|r| r.starts_with("start:")) {
        return Err(CoreError::BadRequest {
            param: Some(param.to_string()),
            message: format!("{param}: a GBNF grammar needs a 'root' rule"),
        });
    }
    Ok(rules.join("\n"))
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
    /// GBNF rule names and their Lark names (lowercase, `-` as `_`, distinct).
    names: HashMap<String, String>,
    param: &'a str,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> CoreError {
        let line = self.text[..self.at.min(self.text.len())].iter().filter(|&&b| b == b'\n').count() + 1;
        CoreError::BadRequest {
            param: Some(self.param.to_string()),
            message: format!("{}: GBNF line {line}: {what}", self.param),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.text[self.at..].starts_with(token.as_bytes()) {
            self.at += token.len();
            true
        } else {
            false
        }
    }

    /// Skips spaces and comments; newlines too when `newlines` (a rule continues on the next line
    /// only inside parentheses, or when the line does not start a new rule).
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\r' => self.at += 1,
                b'\n' if newlines => self.at += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    /// Whether the text from here starts a new rule (`name ::=`).
    fn at_rule_start(&self) -> bool {
        let mut i = self.at;
        while self.text.get(i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_') {
            i += 1;
        }
        if i == self.at {
            return false;
        }
        while self.text.get(i).is_some_and(|c| *c == b' ' || *c == b'\t') {
            i += 1;
        }
        self.text[i..].starts_with(b"::=")
    }

    fn name(&mut self) -> Result<String, CoreError> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
            self.at += 1;
        }
        if start == self.at {
            return Err(self.error("expected a rule name"));
        }
        let gbnf = String::from_utf8_lossy(&self.text[start..self.at]).into_owned();
        if let Some(lark) = self.names.get(&gbnf) {
            return Ok(lark.clone());
        }
        let base = format!("r_{}", gbnf.to_ascii_lowercase().replace('-', "_"));
        let mut lark = base.clone();
        let mut n = 1;
        while self.names.values().any(|v| *v == lark) {
            n += 1;
            lark = format!("{base}_{n}");
        }
        self.names.insert(gbnf, lark.clone());
        Ok(lark)
    }

    /// `seq | seq | ...` up to the end of the rule (`top`) or a closing parenthesis.
    fn alternatives(&mut self, top: bool) -> Result<String, CoreError> {
        let mut alternatives = vec![self.sequence(top)?];
        while self.eat("|") {
            alternatives.push(self.sequence(top)?);
        }
        Ok(alternatives.join(" | "))
    }

    fn sequence(&mut self, top: bool) -> Result<String, CoreError> {
        let mut items = Vec::new();
        loop {
            // Inside parentheses newlines are spaces; at the top a newline ends the rule unless
            // the next line continues it.
            self.skip_space(!top);
            if top && self.peek() == Some(b'\n') {
                let save = self.at;
                self.skip_space(true);
                if self.at >= self.text.len() || self.at_rule_start() {
                    self.at = save;
                    break;
                }
            }
            match self.peek() {
                None | Some(b'|') | Some(b')') => break,
                Some(b'\n') => break,
                _ => {}
            }
            let atom = self.atom()?;
            items.push(self.repetition(atom)?);
        }
        if items.is_empty() {
            return Ok("\"\"".to_string());
        }
        Ok(items.join(" "))
    }

    fn atom(&mut self) -> Result<String, CoreError> {
        match self.peek() {
            Some(b'"') => {
                self.at += 1;
                let mut literal = String::new();
                loop {
                    match self.peek() {
                        None | Some(b'\n') => return Err(self.error("unterminated string literal")),
                        Some(b'"') => {
                            self.at += 1;
                            break;
                        }
                        _ => literal.push(self.char()?),
                    }
                }
                Ok(serde_json::Value::from(literal).to_string())
            }
            Some(b'[') => {
                self.at += 1;
                let mut class = String::from("[");
                if self.eat("^") {
                    class.push('^');
                }
                loop {
                    match self.peek() {
                        None | Some(b'\n') => return Err(self.error("unterminated character class")),
                        Some(b']') => {
                            self.at += 1;
                            break;
                        }
                        _ => {
                            let low = self.char()?;
                            class.push_str(&format!("\\x{{{:X}}}", low as u32));
                            if self.peek() == Some(b'-') && self.text.get(self.at + 1) != Some(&b']') {
                                self.at += 1;
                                let high = self.char()?;
                                class.push_str(&format!("-\\x{{{:X}}}", high as u32));
                            }
                        }
                    }
                }
                class.push(']');
                Ok(format!("/{class}/"))
            }
            Some(b'.') => {
                self.at += 1;
                Ok("/(?s:.)/".to_string())
            }
            Some(b'(') => {
                self.at += 1;
                let inner = self.alternatives(false)?;
                self.skip_space(true);
                if !self.eat(")") {
                    return Err(self.error("expected ')'"));
                }
                Ok(format!("({inner})"))
            }
            Some(b'<') => {
                // A token: `<[id]>` or `<|name|>`, as llguidance writes them.
                let start = self.at;
                while self.peek().is_some_and(|c| c != b'>' && c != b'\n') {
                    self.at += 1;
                }
                if !self.eat(">") {
                    return Err(self.error("unterminated token reference"));
                }
                Ok(String::from_utf8_lossy(&self.text[start..self.at]).into_owned())
            }
            Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => self.name(),
            Some(c) => Err(self.error(&format!("unexpected '{}'", c as char))),
            None => Err(self.error("unexpected end of grammar")),
        }
    }

    fn repetition(&mut self, atom: String) -> Result<String, CoreError> {
        // (A group is already parenthesized.)
        let grouped = if atom.starts_with('(') { atom.clone() } else { format!("({atom})") };
        match self.peek() {
            Some(c @ (b'*' | b'+' | b'?')) => {
                self.at += 1;
                Ok(format!("{atom}{}", c as char))
            }
            Some(b'{') => {
                self.at += 1;
                let start = self.at;
                while self.peek().is_some_and(|c| c != b'}' && c != b'\n') {
                    self.at += 1;
                }
                let bounds: String = String::from_utf8_lossy(&self.text[start..self.at])
                    .chars()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                if !self.eat("}") {
                    return Err(self.error("unterminated repetition '{'"));
                }
                let number = |s: &str| s.parse::<u32>().map_err(|_| self.error(&format!("bad repetition bound '{s}'")));
                let (low, high) = match bounds.split_once(',') {
                    None => {
                        let n = number(&bounds)?;
                        (n, Some(n))
                    }
                    Some((low, high)) => (
                        if low.is_empty() { 0 } else { number(low)? },
                        if high.is_empty() { None } else { Some(number(high)?) },
                    ),
                };
                Ok(match high {
                    Some(high) if high < low => return Err(self.error("repetition bounds are reversed")),
                    Some(high) => format!("{grouped}{{{low},{high}}}"),
                    None if low == 0 => format!("{grouped}*"),
                    None => format!("{grouped}{{{low},}}"),
                })
            }
            _ => Ok(atom),
        }
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char, CoreError> {
        let rest = std::str::from_utf8(&self.text[self.at..]).map_err(|_| self.error("the grammar is not UTF-8"))?;
        let mut chars = rest.chars();
        let c = chars.next().ok_or_else(|| self.error("unexpected end of grammar"))?;
        if c != '\\' {
            self.at += c.len_utf8();
            return Ok(c);
        }
        let escaped = chars.next().ok_or_else(|| self.error("unexpected end after '\\'"))?;
        self.at += 2;
        let hex = |parser: &mut Self, digits: usize| {
            let text = std::str::from_utf8(parser.text.get(parser.at..parser.at + digits).unwrap_or_default())
                .unwrap_or_default()
                .to_string();
            let value = u32::from_str_radix(&text, 16).ok().filter(|_| text.len() == digits).and_then(char::from_u32);
            parser.at += digits;
            value.ok_or_else(|| parser.error(&format!("bad escape '\\{escaped}{text}'")))
        };
        match escaped {
            'n' => Ok('\n'),
            't' => Ok('\t'),
            'r' => Ok('\r'),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gbnf_to_lark;

    #[test]
    fn rules_literals_classes_and_repetitions_map_to_lark() {
        let gbnf = "root ::= answer (\",\" answer){0,2}  # a list\nanswer ::= \"yes\" | \"no\" | [0-9]+ | item-name\nitem-name ::= [^\\n\"]? .";
        let lark = gbnf_to_lark(gbnf, "grammar").unwrap();
        assert_eq!(
            lark,
            "start: r_answer (\",\" r_answer){0,2}\n\
             r_answer: \"yes\" | \"no\" | /[\\x{30}-\\x{39}]/+ | r_item_name\n\
             r_item_name: /[^\\x{A}\\x{22}]/? /(?s:.)/"
        );
    }

    #[test]
    fn a_rule_continues_on_the_next_line_until_a_new_rule_starts() {
        let lark = gbnf_to_lark("root ::= \"a\"\n   \"b\"\n  | \"c\"\nx ::= \"d\"", "grammar").unwrap();
        assert_eq!(lark, "start: \"a\" \"b\" | \"c\"\nr_x: \"d\"");
    }

    #[test]
    fn errors_name_the_line() {
        let error = gbnf_to_lark("root ::= \"a\"\nb ::= [a-", "grammar").unwrap_err().to_string();
        assert!(error.contains("line 2"), "{error}");
        let error = gbnf_to_lark("answer ::= \"a\"", "grammar").unwrap_err().to_string();
        assert!(error.contains("root"), "{error}");
    }
}
