x: int = 1
y: "list[str]"
print(__annotations__)
