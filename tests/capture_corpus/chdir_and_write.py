import os
os.makedirs("elsewhere", exist_ok=True)
os.chdir("elsewhere")
with open("written.txt", "w") as handle:
    handle.write("in elsewhere\n")
print(os.path.basename(os.getcwd()))
