// What the key server takes (keyserver/api/schemas.py's max_length), checked while typing:
// a longer text is refused under its field with both numbers, never cut to fit. The
// browser's maxLength would cut a paste without a word, so the console does not use it.
import { fieldError } from "./api/client";

export const LIMITS = {
  keyName: 128, keyDescription: 2000, keyOwner: 128, revokeMessage: 1000,
  username: 64, fullName: 200, tokenName: 100, kmipClientName: 64,
  databaseName: 64, databaseDescription: 1000,
} as const;

const count = new Intl.NumberFormat("en-US");

/** Characters as the server counts them: code points (Python's len), not UTF-16 units. */
export function charCount(text: string): number {
  return [...text].length;
}

/** "At most 128 characters; this one has 5,000", or null when the text fits. */
export function tooLong(text: string, max: number): string | null {
  const n = charCount(text);
  return n > max ? `At most ${count.format(max)} characters; this one has ${count.format(n)}` : null;
}

/** A field's error: too long as typed, else what the server said about it (a 422), else none. */
export function lengthError(text: string, max: number, serverError: unknown, field: string): string | null {
  return tooLong(text, max) ?? fieldError(serverError, field);
}
