"""One object per upstream kind (a provider): what the guard must know of an upstream beyond the
API shapes it speaks. Pure descriptions: each builds a call (URL, headers, body) and reads an
answer; the server does the I/O. `registry.provider_for` resolves a kind once."""
