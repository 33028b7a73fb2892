import json
with open("output.txt", "w") as handle:
    handle.write("some output\n")
with open("data.json", "w") as handle:
    json.dump({"a": 1}, handle)
print("wrote")
