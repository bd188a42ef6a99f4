// The request options of pyspec/options.py REQUEST (types as typeof names), written by
// webtools/optionsjs.py; do not edit (tests/test_options.py checks it).
export const REQUEST_OPTIONS = {
  max_tokens: {"types": ["number"], "default": 128, "openai": "max_tokens"},
  temperature: {"types": ["number"], "default": 0.0, "openai": "temperature"},
  seed: {"types": ["number"], "default": 0, "openai": "seed"},
  verify: {"types": ["string"], "default": null, "openai": null},
  k: {"types": ["string"], "default": "heuristic", "openai": null},
  tree: {"types": ["string"], "default": null, "openai": null},
  draft: {"types": ["string"], "default": null, "openai": null},
  drill: {"types": ["string"], "default": null, "openai": null},
  context_overflow: {"types": ["string"], "default": "drop_oldest", "openai": null},
  logit_bias: {"types": ["object"], "default": {}, "openai": "logit_bias"},
  repetition_penalty: {"types": ["number"], "default": 1.0, "openai": "repetition_penalty"},
  presence_penalty: {"types": ["number"], "default": 0.0, "openai": "presence_penalty"},
  frequency_penalty: {"types": ["number"], "default": 0.0, "openai": "frequency_penalty"},
  top_k: {"types": ["number"], "default": 0, "openai": "top_k"},
  top_p: {"types": ["number"], "default": 1.0, "openai": "top_p"},
  min_p: {"types": ["number"], "default": 0.0, "openai": "min_p"},
  stop: {"types": ["string", "object"], "default": [], "openai": "stop"},
  json_schema: {"types": ["object"], "default": null, "openai": null},
  response_format: {"types": ["object"], "default": null, "openai": "response_format"},
};
