"""The JSON schemas the structured-output tests constrain answers to (Python API and server alike)."""

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "count", "tags"],
    "additionalProperties": False,
}
FLAG = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "path": {"enum": ["/tmp", "/usr", "/etc"]}},
    "required": ["ok", "path"],
    "additionalProperties": False,
}
