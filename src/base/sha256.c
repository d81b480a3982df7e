/* sha256.c - SHA-256 as specified in FIPS 180-4, and HMAC per RFC 2104. */
#include "base/sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, unsigned n) {
  return (x >> n) | (x << (32 - n));
}

/* The compression function over one 64-byte block (FIPS 180-4, 6.2.2). */
static void compress(uint32_t h[8], const uint8_t *blk) {
  uint32_t w[64];
  for (size_t t = 0; t < 16; t++)
    w[t] = (uint32_t)blk[4 * t] << 24 | (uint32_t)blk[4 * t + 1] << 16 |
           (uint32_t)blk[4 * t + 2] << 8 | (uint32_t)blk[4 * t + 3];
  for (size_t t = 16; t < 64; t++) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (size_t t = 0; t < 64; t++) {
    uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = hh + S1 + ch + K[t] + w[t];
    uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = S0 + maj;
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

void base_sha256_init(base_sha256_ctx *ctx) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(ctx->h, iv, sizeof iv);
  ctx->total = 0;
  ctx->fill = 0;
}

void base_sha256_update(base_sha256_ctx *ctx, const void *data, size_t len) {
  const uint8_t *p = data;
  ctx->total += len;
  if (ctx->fill > 0) {
    size_t take = BASE_SHA256_BLOCK - ctx->fill;
    if (take > len) take = len;
    memcpy(ctx->block + ctx->fill, p, take);
    ctx->fill += take;
    p += take;
    len -= take;
    if (ctx->fill < BASE_SHA256_BLOCK) return;
    compress(ctx->h, ctx->block);
    ctx->fill = 0;
  }
  while (len >= BASE_SHA256_BLOCK) {
    compress(ctx->h, p);
    p += BASE_SHA256_BLOCK;
    len -= BASE_SHA256_BLOCK;
  }
  if (len > 0) {
    memcpy(ctx->block, p, len);
    ctx->fill = len;
  }
}

void base_sha256_final(base_sha256_ctx *ctx, uint8_t out[BASE_SHA256_LEN]) {
  /* Padding: a 1 bit, zeros up to 56 mod 64, then the length in bits. */
  uint64_t bits = ctx->total * 8;
  uint8_t pad[BASE_SHA256_BLOCK + 8] = {0x80};
  size_t padlen = (ctx->fill < 56 ? 56 : 120) - ctx->fill;
  for (size_t i = 0; i < 8; i++) pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
  base_sha256_update(ctx, pad, padlen + 8);
  for (size_t i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(ctx->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(ctx->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(ctx->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)ctx->h[i];
  }
  memset(ctx, 0, sizeof *ctx);
}

void base_sha256(const void *data, size_t len, uint8_t out[BASE_SHA256_LEN]) {
  base_sha256_ctx ctx;
  base_sha256_init(&ctx);
  base_sha256_update(&ctx, data, len);
  base_sha256_final(&ctx, out);
}

void base_hmac_sha256_init(base_hmac_sha256_ctx *ctx, const void *key, size_t keylen) {
  uint8_t k[BASE_SHA256_BLOCK] = {0};
  if (keylen > BASE_SHA256_BLOCK)
    base_sha256(key, keylen, k);
  else if (keylen > 0)
    memcpy(k, key, keylen);
  uint8_t ipad[BASE_SHA256_BLOCK], opad[BASE_SHA256_BLOCK];
  for (size_t i = 0; i < BASE_SHA256_BLOCK; i++) {
    ipad[i] = k[i] ^ 0x36;
    opad[i] = k[i] ^ 0x5c;
  }
  base_sha256_init(&ctx->inner);
  base_sha256_update(&ctx->inner, ipad, sizeof ipad);
  base_sha256_init(&ctx->outer);
  base_sha256_update(&ctx->outer, opad, sizeof opad);
  memset(k, 0, sizeof k);
  memset(ipad, 0, sizeof ipad);
  memset(opad, 0, sizeof opad);
}

void base_hmac_sha256_update(base_hmac_sha256_ctx *ctx, const void *data, size_t len) {
  base_sha256_update(&ctx->inner, data, len);
}

void base_hmac_sha256_final(base_hmac_sha256_ctx *ctx, uint8_t out[BASE_SHA256_LEN]) {
  uint8_t ih[BASE_SHA256_LEN];
  base_sha256_final(&ctx->inner, ih);
  base_sha256_update(&ctx->outer, ih, sizeof ih);
  base_sha256_final(&ctx->outer, out);
}

void base_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                      uint8_t out[BASE_SHA256_LEN]) {
  base_hmac_sha256_ctx ctx;
  base_hmac_sha256_init(&ctx, key, keylen);
  base_hmac_sha256_update(&ctx, data, len);
  base_hmac_sha256_final(&ctx, out);
}

int base_memeq_ct(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= x[i] ^ y[i];
  return d == 0;
}
