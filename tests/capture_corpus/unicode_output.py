print("héllo wörld ✓ 日本 \u00b2")
