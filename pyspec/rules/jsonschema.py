"""JSON Schema -> a byte-level grammar: the automaton the JSON-schema masks walk.

`compile_schema(schema)` checks a schema against the supported subset and returns a `Grammar`,
a pushdown automaton over bytes: a state is a tuple of frames (a stack; each frame a tuple of
ints, hashable, so masks can be cached per state), `step(state, byte)` gives the next state or
None, `allowed(state)` the bytes it accepts, `complete(state)` whether a whole value has been
written, and `forced(state)` the bytes every valid continuation starts with.

The subset (every other keyword is refused with SchemaError, code bad_config, naming it):
  object   properties, required, additionalProperties (false, or absent: no other key is ever
           written); keys come out in the schema's order, optional ones may be left out
  array    items (one schema), minItems, maxItems
  string   maxLength (in characters, as Python's len counts them), enum
  number, integer, boolean, null; `type` may be a list of distinct types (e.g. ["string",
  "null"]); `enum` of any JSON values, alone or with a type; annotations (title, description,
  $schema, $comment, default, examples) are accepted and ignored.
What is written (documented in docs/sampling-and-json.md):
  - compact JSON, no whitespace anywhere: {"a":1,"b":[true,null]}; keys as json.dumps writes
    them (ensure_ascii=False), enum values likewise; or, compiled with `spaced=True` (a tool
    call's arguments, rules/toolgrammar.py), json.dumps's default separators ", " and ": " as a
    chat template's `tojson` writes them: {"a": 1, "b": [true, null]};
  - strings: any Unicode text as well-formed UTF-8 (no control bytes below 0x20), escapes
    \\" \\\\ \\/ \\b \\f \\n \\r \\t and \\uXXXX outside D000-DFFF (no surrogate pairs: write such
    characters as UTF-8), so every string decodes to the characters counted;
  - numbers: -?(0|[1-9][0-9]{0,14}) for integer; number adds an optional fraction of 1-15 digits
    and an optional exponent [eE][+-]?[0-9]{1,2} (every value finite, no 1e999).
Not here: tokens (jsonmask.py turns states into token masks), validation of generated output.
"""

from __future__ import annotations

import json

from ..errors import PyspecError

MAX_INT_DIGITS = 15
MAX_FRAC_DIGITS = 15
MAX_EXP_DIGITS = 2
MAX_DEPTH = 32

ANNOTATIONS = {"title", "description", "$schema", "$comment", "default", "examples"}
KEYWORDS = {"object": {"properties", "required", "additionalProperties"},
            "array": {"items", "minItems", "maxItems"},
            "string": {"maxLength"},
            "number": set(), "integer": set(), "boolean": set(), "null": set()}

OBJ, ARR, STR, NUM, LIT, UNION = range(6)
# String content sub-states (frame[4]): 0 normal; escapes; UTF-8 continuation states.
S_NORMAL, S_ESC, S_U0, S_U1, S_U2, S_U3 = range(6)
S_CONT1, S_CONT2, S_CONT3, S_E0, S_ED, S_F0, S_F4 = range(10, 17)
# Number phases (frame[2]).
N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXPSIGN, N_EXPD = range(9)
_NUM_END = (N_ZERO, N_INT, N_FRAC, N_EXPD)
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DIGITS = frozenset(b"0123456789")


class SchemaError(PyspecError, ValueError):
    """A JSON schema outside the supported subset, or malformed."""

    code = "bad_config"


def string_byte(sub: int, b: int) -> tuple[int, int] | None:
    """One byte of string content from sub-state `sub`: (next sub-state, 1 if a character starts
    here else 0), or None when the byte cannot come here (the closing quote is the caller's).
    The one definition of string content: the grammar's steps and the mask's per-token table
    (jsonmask.py) both use it."""
    if sub == S_NORMAL:
        if b == 0x5C:
            return S_ESC, 1
        if 0x20 <= b < 0x80 and b != 0x22:
            return S_NORMAL, 1
        if 0xC2 <= b <= 0xDF:
            return S_CONT1, 1
        if 0xE0 <= b <= 0xEF:
            return (S_E0 if b == 0xE0 else S_ED if b == 0xED else S_CONT2), 1
        if 0xF0 <= b <= 0xF4:
            return (S_F0 if b == 0xF0 else S_F4 if b == 0xF4 else S_CONT3), 1
        return None
    if sub == S_ESC:
        if b in b'"\\/bfnrt':
            return S_NORMAL, 0
        return (S_U0, 0) if b == 0x75 else None
    if S_U0 <= sub <= S_U3:
        if b not in _HEX or (sub == S_U0 and b in b"dD"):
            return None
        return (S_NORMAL if sub == S_U3 else sub + 1), 0
    lo, hi, nxt = {S_CONT1: (0x80, 0xBF, S_NORMAL), S_CONT2: (0x80, 0xBF, S_CONT1),
                   S_CONT3: (0x80, 0xBF, S_CONT2), S_E0: (0xA0, 0xBF, S_CONT1),
                   S_ED: (0x80, 0x9F, S_CONT1), S_F0: (0x90, 0xBF, S_CONT2),
                   S_F4: (0x80, 0x8F, S_CONT2)}[sub]
    return (nxt, 0) if lo <= b <= hi else None


def _dump(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class Grammar:
    """The compiled schema: nodes (kind, data) and the automaton over them. `spaced`: a space
    after every comma and colon (json.dumps's default separators)."""

    def __init__(self, spaced: bool = False):
        self.nodes: list[tuple] = []
        self.root = 0
        self.spaced = spaced

    # --- building -------------------------------------------------------------------------------
    def _add(self, kind: int, data) -> int:
        self.nodes.append((kind, data))
        return len(self.nodes) - 1

    def start(self, node: int) -> tuple:
        """The frame of a value of `node` before its first byte."""
        kind = self.nodes[node][0]
        if kind == LIT:
            return (node, 0, (1 << len(self.nodes[node][1])) - 1)
        return (node, 0, 0, 0, 0) if kind in (OBJ, STR) else (node, 0, 0)

    def initial(self) -> tuple:
        return (self.start(self.root),)

    # --- the automaton ------------------------------------------------------------------------
    def step(self, state: tuple, b: int) -> tuple | None:
        """The state after byte b, or None when b cannot come next. A frame that can end (a
        number, a literal that is a prefix of a longer one) hands a byte it cannot take to the
        frame below it."""
        while state:
            top = state[-1]
            r = self._step_frame(top, b)
            if r is not None:
                return state[:-1] + r
            if not self.can_end(top):
                return None
            state = state[:-1]
        return None

    def can_end(self, frame: tuple) -> bool:
        kind, data = self.nodes[frame[0]]
        if kind == NUM:
            return frame[1] in _NUM_END
        if kind == LIT:
            return any(frame[2] >> j & 1 and len(a) == frame[1] for j, a in enumerate(data))
        return False

    def complete(self, state: tuple) -> bool:
        """A whole value has been written (it may still go on, as a number can)."""
        return all(self.can_end(f) for f in state)

    def allowed(self, state: tuple) -> list[int]:
        """The bytes `step` accepts from `state`, ascending."""
        cands: set[int] = set()
        for f in reversed(state):   # a frame that can end lets the one below it speak too
            cands |= self._firsts(f)
            if not self.can_end(f):
                break
        return [b for b in sorted(cands) if self.step(state, b) is not None]

    def _firsts(self, f: tuple) -> set[int]:
        """A superset of the bytes frame f accepts (cheap; `allowed` checks each)."""
        kind, data = self.nodes[f[0]]
        if kind == STR:
            return {0x22} if f[1] == 0 else set(range(256))
        if kind == NUM:
            return set(_DIGITS) | set(b"-.eE+")
        if kind == LIT:
            return {a[f[1]] for j, a in enumerate(data) if f[2] >> j & 1 and f[1] < len(a)}
        if kind == UNION:
            return set().union(*(self._firsts(self.start(a)) for a in data))
        if kind == OBJ:
            if f[1] in (0, 3):
                return {0x7B if f[1] == 0 else 0x20}
            return {0x7D, 0x2C, 0x22} if f[1] == 1 else {k[f[3]] for k, _, _ in data
                                                          if f[3] < len(k)}
        if f[1] in (0, 3):   # ARR
            return {0x5B if f[1] == 0 else 0x20}
        return {0x5D, 0x2C} | self._firsts(self.start(data[0]))

    def forced(self, state: tuple, limit: int = 64) -> bytes:
        """The bytes every continuation of `state` starts with (b"" where it branches or may
        end), up to `limit`."""
        out = bytearray()
        while len(out) < limit and not self.complete(state):
            top = self.nodes[state[-1][0]]
            if top[0] == STR and state[-1][1] == 1 and (top[1] is None or state[-1][2] < top[1]):
                break   # inside a string with room: it branches (a shortcut, not a rule)
            nxt = self.allowed(state)
            if len(nxt) != 1:
                break
            out.append(nxt[0])
            state = self.step(state, nxt[0])
        return bytes(out)

    def _step_frame(self, f: tuple, b: int) -> tuple | None:
        """One frame and one byte: the frames that replace it (() when the byte closes it)."""
        node = f[0]
        kind, data = self.nodes[node]
        if kind == STR:
            _, phase, count, _, sub = f
            if phase == 0:
                return ((node, 1, 0, 0, S_NORMAL),) if b == 0x22 else None
            if sub == S_NORMAL and b == 0x22:
                return ()
            r = string_byte(sub, b)
            if r is None or (r[1] and data is not None and count >= data):
                return None
            return ((node, 1, count + r[1], 0, r[0]),)
        if kind == NUM:
            return self._step_number(f, data, b)
        if kind == LIT:
            _, off, alive = f
            alive = sum(1 << j for j, a in enumerate(data)
                        if alive >> j & 1 and off < len(a) and a[off] == b)
            return ((node, off + 1, alive),) if alive else None
        if kind == OBJ:
            return self._step_object(f, data, b)
        if kind == ARR:
            return self._step_array(f, data, b)
        for alt in data:  # UNION: the alternatives' first bytes are disjoint (checked)
            r = self._step_frame(self.start(alt), b)
            if r is not None:
                return r
        return None

    def _step_object(self, f: tuple, props: list, b: int) -> tuple | None:
        node, phase, idx, x, alive = f
        if phase == 0:
            return ((node, 1, idx, 0, 0),) if b == 0x7B else None
        if phase == 3:   # spaced: the space after a comma
            return ((node, 2, idx, 0, alive),) if b == 0x20 else None
        if phase == 1:
            if b == 0x7D and all(not req for _, _, req in props[idx:]):
                return ()
            reach = self._reachable(props, idx)
            if x:   # after a value: a comma (and a space where spaced), then a key
                return ((node, 3 if self.spaced else 2, idx, 0, reach),) \
                    if b == 0x2C and reach else None
            f = (node, 2, idx, 0, reach)
            phase = 2
        off = f[3]
        keep = [j for j in range(len(props)) if f[4] >> j & 1
                and off < len(props[j][0]) and props[j][0][off] == b]
        if not keep:
            return None
        done = [j for j in keep if len(props[j][0]) == off + 1]
        if done:  # `"key":` written (its last byte makes it unique: keys end in `"`): the value
            j = done[0]
            return (node, 1, j + 1, 1, 0), self.start(props[j][1])
        return ((node, 2, idx, off + 1, sum(1 << j for j in keep)),)

    @staticmethod
    def _reachable(props: list, idx: int) -> int:
        """Bitmask of the properties that may come next: from idx up to the first required."""
        mask = 0
        for j in range(idx, len(props)):
            mask |= 1 << j
            if props[j][2]:
                break
        return mask

    def _step_array(self, f: tuple, data: tuple, b: int) -> tuple | None:
        node, phase, count = f
        item, lo, hi = data
        if phase == 0:
            return ((node, 1, 0),) if b == 0x5B else None
        if phase == 3:   # spaced: the space after a comma
            return ((node, 2, count),) if b == 0x20 else None
        if phase == 1:
            if b == 0x5D and count >= lo:
                return ()
            if count:
                return ((node, 3 if self.spaced else 2, count),) \
                    if b == 0x2C and (hi is None or count < hi) else None
            if hi == 0:
                return None
        r = self._step_frame(self.start(item), b)  # the item's first byte
        return None if r is None else ((node, 1, count + 1),) + r

    @staticmethod
    def _step_number(f: tuple, is_int: bool, b: int) -> tuple | None:
        node, phase, count = f
        digit = b in _DIGITS
        if phase in (N_START, N_MINUS):
            if b == 0x2D and phase == N_START:
                return ((node, N_MINUS, 0),)
            if b == 0x30:
                return ((node, N_ZERO, 0),)
            return ((node, N_INT, 1),) if digit else None
        if phase == N_INT and digit:
            return ((node, N_INT, count + 1),) if count < MAX_INT_DIGITS else None
        if is_int:
            return None
        if phase in (N_ZERO, N_INT) and b == 0x2E:
            return ((node, N_DOT, 0),)
        if phase in (N_DOT, N_FRAC) and digit:
            return ((node, N_FRAC, count + 1),) if count < MAX_FRAC_DIGITS else None
        if phase in (N_ZERO, N_INT, N_FRAC) and b in b"eE":
            return ((node, N_EXP, 0),)
        if phase == N_EXP and b in b"+-":
            return ((node, N_EXPSIGN, 0),)
        if phase in (N_EXP, N_EXPSIGN, N_EXPD) and digit:
            return ((node, N_EXPD, count + 1),) if count < MAX_EXP_DIGITS else None
        return None


# ---------------------------------------------------------------------------------------------
# Schema -> nodes
# ---------------------------------------------------------------------------------------------
def compile_schema(schema) -> Grammar:
    """Check `schema` (a dict, or JSON text) and compile it; SchemaError says what is wrong."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise SchemaError(f"the JSON schema is not valid JSON ({e}); pass a JSON object")
    g = Grammar()
    g.root = compile_into(g, schema, "schema")
    return g


def compile_into(g: Grammar, schema, where: str) -> int:
    """Compile `schema` into the grammar `g` (its nodes added); returns its node. `where` names
    it in a SchemaError ("tools[0].function.parameters")."""
    return _compile(g, schema, where, 0)


def _compile(g: Grammar, s, where: str, depth: int) -> int:
    if depth > MAX_DEPTH:
        raise SchemaError(f"{where}: schemas nested deeper than {MAX_DEPTH} are not supported")
    if not isinstance(s, dict):
        raise SchemaError(f"{where} must be a JSON object (a schema), got {type(s).__name__}")
    types = s.get("type")
    if isinstance(types, list):
        if not types or len(set(map(str, types))) != len(types):
            raise SchemaError(f"{where}.type: a list of types must be non-empty and distinct")
    elif types is not None:
        types = [types]
    for t in types or []:
        if t not in KEYWORDS:
            raise SchemaError(f"{where}.type {t!r} is not supported: use one of "
                              f"{', '.join(KEYWORDS)}")
    known = ANNOTATIONS | {"type", "enum"} | set().union(*KEYWORDS.values())
    allowed = ANNOTATIONS | {"type", "enum"} | set().union(*(KEYWORDS[t] for t in types or []))
    for key in sorted(s, key=lambda k: k in known):   # an unknown keyword is named first
        if key in known and types is None and "enum" not in s:
            raise SchemaError(f"{where} needs a \"type\" (or an \"enum\")")
        if key not in allowed:
            what = f"for type {'/'.join(types)}" if types else "without a type"
            raise SchemaError(f"{where}: keyword {key!r} is not supported {what}; the subset is "
                              "type, properties, required, additionalProperties (false), items, "
                              "minItems, maxItems, maxLength, enum")
    if "enum" in s:
        return _enum(g, s["enum"], types, where)
    if types is None:
        raise SchemaError(f"{where} needs a \"type\" (or an \"enum\")")
    if len(types) > 1:
        if {"integer", "number"} <= set(types):
            raise SchemaError(f"{where}.type lists both integer and number: list number alone")
        return g._add(UNION, tuple(_compile(g, {**{k: v for k, v in s.items() if k in KEYWORDS[t]},
                                                "type": t}, where, depth) for t in types))
    t = types[0]
    if t == "object":
        return _object(g, s, where, depth)
    if t == "array":
        lo, hi = _count(s, "minItems", where, 0), _count(s, "maxItems", where, None)
        if hi is not None and lo > hi:
            raise SchemaError(f"{where}: minItems {lo} > maxItems {hi}")
        if "items" not in s:
            raise SchemaError(f"{where}: an array needs \"items\" (the schema of its items)")
        return g._add(ARR, (_compile(g, s["items"], where + ".items", depth + 1), lo, hi))
    if t == "string":
        return g._add(STR, _count(s, "maxLength", where, None))
    if t in ("number", "integer"):
        return g._add(NUM, t == "integer")
    return g._add(LIT, (b"true", b"false") if t == "boolean" else (b"null",))


def _count(s: dict, key: str, where: str, default):
    v = s.get(key, default)
    if v is not default and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise SchemaError(f"{where}.{key} must be an integer >= 0, got {v!r}")
    return v


def _enum(g: Grammar, values, types, where: str) -> int:
    if not isinstance(values, list) or not values:
        raise SchemaError(f"{where}.enum must be a non-empty list of values")
    names = {str: "string", bool: "boolean", type(None): "null", dict: "object", list: "array"}
    alts = []
    for v in values:
        t = names.get(type(v), "integer" if isinstance(v, int) else "number")
        if types and t not in types and not (t == "integer" and "number" in types):
            raise SchemaError(f"{where}.enum value {v!r} is not of type {'/'.join(types)}")
        if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
            raise SchemaError(f"{where}.enum value {v!r} is not a JSON number")
        if _dump(v) not in alts:
            alts.append(_dump(v))
    return g._add(LIT, tuple(alts))


def _object(g: Grammar, s: dict, where: str, depth: int) -> int:
    props = s.get("properties", {})
    required = s.get("required", [])
    if not isinstance(props, dict):
        raise SchemaError(f"{where}.properties must be an object of name -> schema")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"{where}.required must be a list of property names")
    for r in required:
        if r not in props:
            raise SchemaError(f"{where}.required names {r!r}, which is not in properties")
    if s.get("additionalProperties", False) is not False:
        raise SchemaError(f"{where}: additionalProperties must be false (or absent): only the "
                          "listed properties can be generated")
    colon = b": " if g.spaced else b":"
    out = [(_dump(name) + colon, _compile(g, sub, f"{where}.properties.{name}", depth + 1),
            name in required) for name, sub in props.items()]
    return g._add(OBJ, out)
