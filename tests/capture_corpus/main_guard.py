def main():
    print("main ran")


if __name__ == "__main__":
    main()
