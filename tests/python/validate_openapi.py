"""Validates an OpenAPI document with `openapi-spec-validator` (the registry package): exits non-zero,
printing why, unless the document is a valid OpenAPI 3.1 document.

Usage: python validate_openapi.py PATH
"""

import json
import sys

from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator

with open(sys.argv[1], encoding="utf-8") as file:
    document = json.load(file)
validate(document, cls=OpenAPIV31SpecValidator)
print(json.dumps({"case": "valid", "openapi": document["openapi"], "paths": len(document["paths"])}))
