// SpecError: every error the client and its facade throw, with a `code` (client.d.ts
// SpecErrorCode lists them; worker.js's replies carry the same codes).

export class SpecError extends Error {
  constructor(code, message) {
    super(message);
    this.name = "SpecError";
    this.code = code;
  }
}
