"""The relay: the MLS delivery service. It authenticates agents by JWT, orders and stores
ciphertext per channel, fans it out, and lets offline agents catch up."""
