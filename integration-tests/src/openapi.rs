//! docs/api.yaml for tests: its operations, and the JSON Schema subset it
//! uses, checked. The validator knows exactly the keywords the document
//! uses and fails on any other, so that a schema cannot pass by using a
//! keyword nobody checks.

use serde_json::Value;

/// The OpenAPI document.
pub struct Document {
    root: Value,
}

/// Keywords of a schema that only describe.
const ANNOTATIONS: [&str; 3] = ["description", "example", "title"];

impl Document {
    /// Reads `docs/api.yaml` of this workspace.
    pub fn load() -> Self {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.yaml");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let root = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        Self { root }
    }

    /// Every documented (METHOD, path).
    pub fn operations(&self) -> Vec<(String, String)> {
        let mut ops = Vec::new();
        for (path, item) in self.root["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("a path item").keys() {
                ops.push((method.to_ascii_uppercase(), path.clone()));
            }
        }
        ops
    }

    fn operation(&self, method: &str, path: &str) -> &Value {
        let op = &self.root["paths"][path][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {path} is not documented");
        op
    }

    /// The example request body of an operation, if it takes one.
    pub fn example_body(&self, method: &str, path: &str) -> Option<Value> {
        let body = &self.operation(method, path)["requestBody"]["content"]["application/json"];
        body.get("example").cloned()
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let pointer = reference.strip_prefix('#').expect("a local $ref");
                let target = self
                    .root
                    .pointer(pointer)
                    .unwrap_or_else(|| panic!("no {reference}"));
                self.resolve(target)
            }
            None => schema,
        }
    }

    /// The schema of a response, or why there is none.
    pub fn response_schema(
        &self,
        method: &str,
        path: &str,
        status: u16,
        content_type: &str,
    ) -> Result<&Value, String> {
        let response = &self.operation(method, path)["responses"][status.to_string()];
        let response = self.resolve(response);
        if !response.is_object() {
            return Err(format!(
                "{method} {path}: status {status} is not documented"
            ));
        }
        let media = content_type.split(';').next().unwrap_or_default().trim();
        response["content"]
            .get(media)
            .map(|m| &m["schema"])
            .ok_or_else(|| {
                format!("{method} {path} {status}: content type {media} is not documented")
            })
    }

    /// The schema of the error object.
    pub fn error_schema(&self) -> &Value {
        &self.root["components"]["schemas"]["Error"]
    }

    /// Checks `value` against `schema`; the error names where it fails.
    pub fn validate(&self, schema: &Value, value: &Value) -> Result<(), String> {
        self.check(schema, value, "$")
    }

    fn check(&self, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
        let schema = self.resolve(schema);
        let object = schema
            .as_object()
            .ok_or_else(|| format!("{at}: schema is not an object"))?;
        for key in object.keys() {
            let known = [
                "type",
                "properties",
                "required",
                "additionalProperties",
                "enum",
                "items",
                "minimum",
                "oneOf",
            ];
            if !known.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) {
                return Err(format!(
                    "{at}: the validator does not know the keyword {key}"
                ));
            }
        }
        if let Some(variants) = schema.get("oneOf") {
            let matching = variants
                .as_array()
                .unwrap()
                .iter()
                .filter(|v| self.check(v, value, at).is_ok())
                .count();
            if matching != 1 {
                return Err(format!("{at}: {matching} of oneOf's schemas match {value}"));
            }
        }
        if let Some(types) = schema.get("type") {
            let types: Vec<&str> = match types {
                Value::String(t) => vec![t.as_str()],
                Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                _ => return Err(format!("{at}: bad type keyword")),
            };
            let is = |t: &str| match t {
                "object" => value.is_object(),
                "array" => value.is_array(),
                "string" => value.is_string(),
                "boolean" => value.is_boolean(),
                "null" => value.is_null(),
                "integer" => value.is_u64() || value.is_i64(),
                "number" => value.is_number(),
                _ => false,
            };
            if !types.iter().any(|t| is(t)) {
                return Err(format!("{at}: {value} is not of type {types:?}"));
            }
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
            if !allowed.contains(value) {
                return Err(format!("{at}: {value} is not one of {allowed:?}"));
            }
        }
        if let (Some(min), Some(n)) = (
            schema.get("minimum").and_then(Value::as_f64),
            value.as_f64(),
        ) {
            if n < min {
                return Err(format!("{at}: {n} is below the minimum {min}"));
            }
        }
        if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
            for (i, item) in array.iter().enumerate() {
                self.check(items, item, &format!("{at}[{i}]"))?;
            }
        }
        if let Some(fields) = value.as_object() {
            let properties = schema.get("properties").and_then(Value::as_object);
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for name in required.iter().filter_map(Value::as_str) {
                    if !fields.contains_key(name) {
                        return Err(format!("{at}: the required field {name} is missing"));
                    }
                }
            }
            for (name, field) in fields {
                let here = format!("{at}.{name}");
                match (
                    properties.and_then(|p| p.get(name)),
                    schema.get("additionalProperties"),
                ) {
                    (Some(s), _) => self.check(s, field, &here)?,
                    (None, Some(Value::Bool(false))) => {
                        return Err(format!("{here}: not in the schema"))
                    }
                    (None, Some(s)) if s.is_object() => self.check(s, field, &here)?,
                    (None, _) => {}
                }
            }
        }
        Ok(())
    }
}
